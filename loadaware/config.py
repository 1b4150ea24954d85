"""The one settings object: command-line flag > environment variable > default, validated at start.

A bad flag value is refused with a message naming the flag. A bad environment value falls back to the
default with a warning (an unparsable LOADAWARE_BETA in a pod spec must not take the gateway down).
Every value remembers where it came from, so the effective configuration can be explained.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from loadaware.fleet.addresses import (
    FeedAddress,
    parse_endpoint_list,
    parse_feed_map,
    parse_hostport,
    parse_instance_map,
)
from loadaware.policies import POLICY_NAMES

log = logging.getLogger(__name__)


class ConfigError(ValueError):
    """A setting that cannot be used; the message names the flag."""


# ---- value parsers: each raises ValueError with a short reason ----

DISCOVERY_MODES = ("static", "file", "envoy-admin", "kubernetes", "inference-pool")


def parse_discovery(text: str) -> str:
    mode = text.strip().lower()
    if mode not in DISCOVERY_MODES:
        raise ValueError(f"{text!r}: expected one of {', '.join(DISCOVERY_MODES)}")
    return mode


def parse_name(text: str) -> str:
    if not text.strip() or any(c.isspace() for c in text.strip()):
        raise ValueError(f"{text!r} is not a name")
    return text.strip()


def parse_beta(text: str) -> float:
    value = float(text)
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{text!r}: beta must be a finite number >= 0")
    return value


def parse_positive(text: str) -> float:
    value = float(text)
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{text!r} must be a positive number")
    return value


def parse_non_negative(text: str) -> float:
    value = float(text)
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{text!r} must be a number >= 0")
    return value


def parse_policy(text: str) -> str:
    if text not in POLICY_NAMES:
        raise ValueError(f"{text!r}: expected one of {', '.join(POLICY_NAMES)}")
    return text


def parse_url(text: str) -> str:
    text = text.strip().rstrip("/")
    if not text.startswith(("http://", "https://")):
        raise ValueError(f"{text!r} is not an http(s) URL")
    return text


def parse_header_name(text: str) -> str:
    name = text.strip().lower()
    if not name or any(c.isspace() or c == ":" for c in name):
        raise ValueError(f"{text!r} is not a valid header name")
    return name


def parse_log_level(text: str) -> str:
    level = text.strip().upper()
    if level not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        raise ValueError(f"{text!r}: expected debug, info, warning or error")
    return level


def parse_path(text: str) -> str:
    if not text.strip():
        raise ValueError("empty path")
    return text.strip()


def parse_optional_hostport(text: str) -> str:
    if text.strip().lower() in ("", "off", "none"):
        return ""
    host, port = parse_hostport(text)
    return f"{host}:{port}"


PREFIX_SOURCES = ("lmcache", "kv-events", "approx")


def parse_prefix_sources(text: str) -> tuple[str, ...]:
    """`lmcache`, `kv-events`, `approx`, or a comma combination; `auto` (or empty) = the default."""
    items = [t.strip().lower() for t in text.split(",") if t.strip()]
    if not items or items == ["auto"]:
        return ()
    unknown = [t for t in items if t not in PREFIX_SOURCES]
    if unknown:
        raise ValueError(f"{', '.join(unknown)}: expected a comma list of {', '.join(PREFIX_SOURCES)}")
    return tuple(s for s in PREFIX_SOURCES if s in items)  # canonical order, no duplicates


def parse_port(text: str) -> int:
    port = int(text)
    if not 0 <= port <= 65535:
        raise ValueError(f"port {port} out of range (0 = off)")
    return port


def parse_count(text: str) -> int:
    value = int(text)
    if value < 0:
        raise ValueError(f"{text!r} must be an integer >= 0")
    return value


NO_ENDPOINT_REPLIES = ("auto", "unavailable", "fallback")


def parse_no_endpoint_reply(text: str) -> str:
    value = text.strip().lower()
    if value not in NO_ENDPOINT_REPLIES:
        raise ValueError(f"{text!r}: expected one of {', '.join(NO_ENDPOINT_REPLIES)}")
    return value


def parse_positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise ValueError(f"{text!r} must be a positive integer")
    return value



@dataclass(frozen=True)
class Setting:
    name: str  # attribute on Settings
    flag: str
    env: str
    default: Any
    parse: Callable[[str], Any]
    help: str


SETTINGS: tuple[Setting, ...] = (
    Setting("listen", "--listen", "LOADAWARE_LISTEN", "127.0.0.1:9002", parse_optional_hostport,
            "gRPC address for ext_proc and health (the debug API is on --admin-listen)"),
    Setting("endpoints", "--endpoints", "LOADAWARE_ENDPOINTS", (), parse_endpoint_list,
            "engines as Envoy's cluster names them: HOST:PORT,..."),
    Setting("endpoints_file", "--endpoints-file", "LOADAWARE_ENDPOINTS_FILE", "", parse_path,
            "file of HOST:PORT lines or commas, re-read when it changes"),
    # Endpoint discovery (loadaware/fleet/discovery/); the default follows --endpoints / --endpoints-file.
    Setting("discovery", "--discovery", "LOADAWARE_DISCOVERY", "", parse_discovery,
            "static | file | envoy-admin | kubernetes | inference-pool (default: file with --endpoints-file, "
            "else static)"),
    Setting("envoy_admin_url", "--envoy-admin-url", "LOADAWARE_ENVOY_ADMIN_URL", "", parse_url,
            "envoy-admin discovery: Envoy's admin API, e.g. http://127.0.0.1:9901"),
    Setting("envoy_cluster", "--envoy-cluster", "LOADAWARE_ENVOY_CLUSTER", "engines", parse_name,
            "envoy-admin discovery: the cluster whose hosts are the engines"),
    Setting("discovery_interval_s", "--discovery-interval-s", "LOADAWARE_DISCOVERY_INTERVAL_S", 1.0,
            parse_positive, "envoy-admin discovery: polling period"),
    Setting("k8s_namespace", "--k8s-namespace", "LOADAWARE_K8S_NAMESPACE", "", parse_name,
            "kubernetes discovery: the Service's namespace (default: the pod's own)"),
    Setting("k8s_service", "--k8s-service", "LOADAWARE_K8S_SERVICE", "", parse_name,
            "kubernetes discovery: the engines' Service (its EndpointSlices are watched)"),
    Setting("k8s_port_name", "--k8s-port-name", "LOADAWARE_K8S_PORT_NAME", "", parse_name,
            "kubernetes discovery: the Service port Envoy sends to (default: the only one)"),
    Setting("kubeconfig", "--kubeconfig", "LOADAWARE_KUBECONFIG", "", parse_path,
            "kubernetes discovery outside a cluster: kubeconfig file (default: in-cluster service account)"),
    Setting("inference_pool", "--inference-pool", "LOADAWARE_INFERENCE_POOL", "", parse_name,
            "inference-pool discovery: the InferencePool whose pods are the engines (in --k8s-namespace)"),
    Setting("policy", "--policy", "LOADAWARE_POLICY", "loadaware", parse_policy,
            "loadaware | kvaware | roundrobin | leastload"),
    Setting("loadaware_beta", "--loadaware-beta", "LOADAWARE_BETA", 1.0, parse_beta,
            "exchange rate between prefix benefit and relative load (>= 0)"),
    Setting("lmcache_url", "--lmcache-url", "LOADAWARE_LMCACHE_URL", "", parse_url,
            "LMCache controller HTTP API, e.g. http://127.0.0.1:9000"),
    Setting("lmcache_instance_map", "--lmcache-instance-map", "LOADAWARE_LMCACHE_INSTANCE_MAP", {},
            parse_instance_map, "explicit LMCache instance ids: ID=HOST:PORT,..."),
    Setting("lmcache_timeout_ms", "--lmcache-timeout-ms", "LOADAWARE_LMCACHE_TIMEOUT_MS", 100.0,
            parse_positive, "time box for one LMCache lookup"),
    Setting("instance_refresh_s", "--instance-refresh-s", "LOADAWARE_INSTANCE_REFRESH_S", 30.0,
            parse_positive, "period of the LMCache worker-info refresh (sooner when stale)"),
    Setting("tokenizer", "--tokenizer", "LOADAWARE_TOKENIZER", "", parse_path,
            "tokenizer.json, or a model folder holding it and tokenizer_config.json"),
    Setting("tokenizer_timeout_ms", "--tokenizer-timeout-ms", "LOADAWARE_TOKENIZER_TIMEOUT_MS", 200.0,
            parse_positive, "time box for one tokenization"),
    Setting("tokenizer_inline_chars", "--tokenizer-inline-chars", "LOADAWARE_TOKENIZER_INLINE_CHARS", 2048,
            parse_count, "a prompt whose uncached part is at most this many characters is tokenized on the event "
                         "loop (cheaper than a thread hop); longer ones in a worker thread (0: always a thread)"),
    Setting("metrics_listen", "--metrics-listen", "LOADAWARE_METRICS_LISTEN", "127.0.0.1:9102",
            parse_optional_hostport, "Prometheus /metrics address, nothing else ('off' to disable)"),
    # The debug API can tell whether a prompt was recently served: keep it on loopback (kubectl port-forward).
    Setting("admin_listen", "--admin-listen", "LOADAWARE_ADMIN_LISTEN", "127.0.0.1:9004", parse_optional_hostport,
            "gRPC address of the debug API (loadaware.v1.Router), reflection and health; loopback ('off' to disable)"),
    Setting("admin_http_listen", "--admin-http-listen", "LOADAWARE_ADMIN_HTTP_LISTEN", "127.0.0.1:9005",
            parse_optional_hostport, "HTTP address of /debug/decisions and /debug/state; loopback ('off' to disable)"),
    Setting("destination_header", "--destination-header", "LOADAWARE_DESTINATION_HEADER",
            "x-gateway-destination-endpoint", parse_header_name, "header Envoy's override_host reads"),
    Setting("fallback_endpoints", "--fallback-endpoints", "LOADAWARE_FALLBACK_ENDPOINTS", 2, parse_count,
            "next-best endpoints named after the choice, for the proxy's retries to walk (0 = the choice only)"),
    Setting("no_endpoint_reply", "--no-endpoint-reply", "LOADAWARE_NO_ENDPOINT_REPLY", "auto",
            parse_no_endpoint_reply, "nobody to route to: unavailable (503), fallback (the proxy's own "
            "fallback picks), auto (503 in full-duplex picker mode, fallback in BUFFERED mode)"),
    Setting("max_request_body_bytes", "--max-request-body-bytes", "LOADAWARE_MAX_REQUEST_BODY_BYTES",
            8 * 1024 * 1024, parse_positive_int, "largest request body held in full-duplex mode (413 beyond)"),
    Setting("scrape_interval_s", "--scrape-interval-s", "LOADAWARE_SCRAPE_INTERVAL_S", 1.0, parse_positive,
            "period of the engines' /metrics scrape"),
    Setting("scrape_timeout_ms", "--scrape-timeout-ms", "LOADAWARE_SCRAPE_TIMEOUT_MS", 500.0,
            parse_positive, "time box for one engine scrape"),
    Setting("scrape_stale_s", "--scrape-stale-s", "LOADAWARE_SCRAPE_STALE_S", 5.0, parse_positive,
            "a scrape older than this is ignored"),
    Setting("eject_after_failures", "--eject-after-failures", "LOADAWARE_EJECT_AFTER_FAILURES", 3, parse_count,
            "consecutive failed requests (5xx, timeout, passed over by the proxy's retries) that take an engine "
            "out of rotation (0 = never)"),
    Setting("ejection_base_s", "--ejection-base-s", "LOADAWARE_EJECTION_BASE_S", 1.0, parse_positive,
            "first ejection's length; each further one in a row doubles it, up to --ejection-max-s"),
    Setting("ejection_max_s", "--ejection-max-s", "LOADAWARE_EJECTION_MAX_S", 5.0, parse_positive,
            "longest ejection: a healed engine is probed, and back, within about this long"),
    Setting("unreachable_after_scrapes", "--unreachable-after-scrapes", "LOADAWARE_UNREACHABLE_AFTER_SCRAPES", 2,
            parse_count, "consecutive scrapes that time out or cannot connect that take an engine out until a "
                         "scrape succeeds (0 = never)"),
    Setting("models_refresh_s", "--models-refresh-s", "LOADAWARE_MODELS_REFRESH_S", 10.0, parse_non_negative,
            "period of the engines' /v1/models fetch (the request's model selects its engines; 0 = off, "
            "every engine serves every model)"),
    Setting("shutdown_grace_s", "--shutdown-grace-s", "LOADAWARE_SHUTDOWN_GRACE_S", 10.0, parse_positive,
            "how long SIGTERM waits for open streams"),
    Setting("health_listen", "--health-listen", "LOADAWARE_HEALTH_LISTEN", "", parse_optional_hostport,
            "extra plain-text gRPC port serving only grpc.health.v1 (kubelet's gRPC probes speak no TLS)"),
    Setting("tls_cert", "--tls-cert", "LOADAWARE_TLS_CERT", "", parse_path,
            "PEM certificate chain: serve the gRPC port over TLS (gateways that dial their picker with TLS)"),
    Setting("tls_key", "--tls-key", "LOADAWARE_TLS_KEY", "", parse_path, "PEM private key for --tls-cert"),
    Setting("tls_client_ca", "--tls-client-ca", "LOADAWARE_TLS_CLIENT_CA", "", parse_path,
            "PEM CA bundle: require and verify client certificates (mutual TLS)"),
    Setting("prefix_source", "--prefix-source", "LOADAWARE_PREFIX_SOURCE", (), parse_prefix_sources,
            "lmcache | kv-events | approx, or a comma combination (default: lmcache with --lmcache-url, "
            "else approx)"),
    Setting("kv_events_port", "--kv-events-port", "LOADAWARE_KV_EVENTS_PORT", 5557, parse_port,
            "port of each engine's vLLM KV-event PUB socket, on the endpoint's host (0 = explicit map only)"),
    Setting("kv_events_replay_port", "--kv-events-replay-port", "LOADAWARE_KV_EVENTS_REPLAY_PORT", 5558,
            parse_port, "port of each engine's KV-event replay (ROUTER) socket (0 = none)"),
    Setting("kv_events_endpoints", "--kv-events-endpoints", "LOADAWARE_KV_EVENTS_ENDPOINTS", {},
            parse_feed_map, "explicit publishers: ENDPOINT=HOST:PUB_PORT[/REPLAY_PORT][@FIRST[-LAST] ranks],..."),
    Setting("kv_events_dp_ranks", "--kv-events-dp-ranks", "LOADAWARE_KV_EVENTS_DP_RANKS", 1, parse_positive_int,
            "data-parallel ranks behind each endpoint: ranks 0..N-1 publish on the KV-event ports + rank; "
            "an endpoint is credited with the minimum over its ranks"),
    Setting("kv_events_topic", "--kv-events-topic", "LOADAWARE_KV_EVENTS_TOPIC", "", str,
            "KV-event topic to subscribe to (vLLM's default is empty)"),
    Setting("kv_events_max_blocks", "--kv-events-max-blocks", "LOADAWARE_KV_EVENTS_MAX_BLOCKS", 1_500_000,
            parse_positive_int, "memory bound of the KV-events index, in blocks over all engines (~370 B each; "
                                "docs/memory.md)"),
    Setting("kv_events_replay_timeout_ms", "--kv-events-replay-timeout-ms",
            "LOADAWARE_KV_EVENTS_REPLAY_TIMEOUT_MS", 2000.0, parse_positive, "time box for one replay"),
    Setting("approx_capacity_tokens", "--approx-capacity-tokens", "LOADAWARE_APPROX_CAPACITY_TOKENS", 100_000,
            parse_positive_int, "approximate source: each engine's prefix-cache capacity, in tokens"),
    Setting("approx_ttl_s", "--approx-ttl-s", "LOADAWARE_APPROX_TTL_S", 300.0, parse_positive,
            "approximate source: a guessed block not routed to for this long is forgotten"),
    Setting("approx_max_blocks", "--approx-max-blocks", "LOADAWARE_APPROX_MAX_BLOCKS", 500_000, parse_positive_int,
            "approximate source: memory bound over all engines, in blocks (~190 B each; docs/memory.md)"),
    Setting("log_level", "--log-level", "LOADAWARE_LOG_LEVEL", "INFO", parse_log_level,
            "debug logs every decision"),
    # Memory under steady load (collector.py): grpc.aio's per-RPC cycles reach the old generation; free them.
    Setting("gc_full_interval_s", "--gc-full-interval-s", "LOADAWARE_GC_FULL_INTERVAL_S", 30.0, parse_non_negative,
            "period of a full garbage collection and malloc-heap trim, on the event loop (15-28 ms of CPU measured; "
            "0 = leave it to CPython's own schedule, under which grpc's per-RPC cycles pile up)"),
    # Diagnostics for memory growth (telemetry/memory_snapshots.py); off by default: tracing slows the sidecar.
    Setting("tracemalloc_dir", "--tracemalloc-dir", "LOADAWARE_TRACEMALLOC_DIR", "", parse_path,
            "trace allocations and write a tracemalloc snapshot and live-object counts into this folder"),
    Setting("tracemalloc_interval_s", "--tracemalloc-interval-s", "LOADAWARE_TRACEMALLOC_INTERVAL_S", 60.0,
            parse_positive, "period of the --tracemalloc-dir snapshots"),
)

SETTINGS_BY_NAME = {s.name: s for s in SETTINGS}


@dataclass(frozen=True)
class Settings:
    listen: str = "127.0.0.1:9002"
    endpoints: tuple[str, ...] = ()
    endpoints_file: str = ""
    discovery: str = ""
    envoy_admin_url: str = ""
    envoy_cluster: str = "engines"
    discovery_interval_s: float = 1.0
    k8s_namespace: str = ""
    k8s_service: str = ""
    k8s_port_name: str = ""
    kubeconfig: str = ""
    inference_pool: str = ""
    policy: str = "loadaware"
    loadaware_beta: float = 1.0
    lmcache_url: str = ""
    lmcache_instance_map: Mapping[str, str] = field(default_factory=dict)
    lmcache_timeout_ms: float = 100.0
    instance_refresh_s: float = 30.0
    tokenizer: str = ""
    tokenizer_timeout_ms: float = 200.0
    tokenizer_inline_chars: int = 2048
    metrics_listen: str = "127.0.0.1:9102"
    admin_listen: str = "127.0.0.1:9004"
    admin_http_listen: str = "127.0.0.1:9005"
    destination_header: str = "x-gateway-destination-endpoint"
    fallback_endpoints: int = 2
    no_endpoint_reply: str = "auto"
    max_request_body_bytes: int = 8 * 1024 * 1024
    scrape_interval_s: float = 1.0
    scrape_timeout_ms: float = 500.0
    scrape_stale_s: float = 5.0
    eject_after_failures: int = 3
    ejection_base_s: float = 1.0
    ejection_max_s: float = 5.0
    unreachable_after_scrapes: int = 2
    models_refresh_s: float = 10.0
    shutdown_grace_s: float = 10.0
    health_listen: str = ""
    tls_cert: str = ""
    tls_key: str = ""
    tls_client_ca: str = ""
    prefix_source: tuple[str, ...] = ()
    kv_events_port: int = 5557
    kv_events_replay_port: int = 5558
    kv_events_endpoints: Mapping[str, FeedAddress] = field(default_factory=dict)
    kv_events_dp_ranks: int = 1
    kv_events_topic: str = ""
    kv_events_max_blocks: int = 1_500_000
    kv_events_replay_timeout_ms: float = 2000.0
    approx_capacity_tokens: int = 100_000
    approx_ttl_s: float = 300.0
    approx_max_blocks: int = 500_000
    log_level: str = "INFO"
    gc_full_interval_s: float = 30.0
    tracemalloc_dir: str = ""
    tracemalloc_interval_s: float = 60.0
    # where each value came from: "flag", "env" or "default"
    origins: Mapping[str, str] = field(default_factory=dict)

    @property
    def prefix_sources(self) -> tuple[str, ...]:
        """The prefix sources in effect: the flag's, else LMCache when its URL is set, else approximate."""
        return self.prefix_source or (("lmcache",) if self.lmcache_url else ("approx",))

    @property
    def discovery_mode(self) -> str:
        """--discovery, or what --endpoints / --endpoints-file imply."""
        return self.discovery or ("file" if self.endpoints_file else "static")

    def describe(self) -> list[dict[str, Any]]:
        """The effective configuration with each value's origin (for GetConfig and logs)."""
        out = []
        for s in SETTINGS:
            value = getattr(self, s.name)
            if isinstance(value, tuple):
                value = list(value)
            elif isinstance(value, Mapping):
                value = {k: v if isinstance(v, (str, int, float, bool)) else str(v) for k, v in value.items()}
            if s.name == "discovery" and not value:
                value = self.discovery_mode  # what "not given" amounts to
            out.append({"name": s.name, "flag": s.flag, "env": s.env, "value": value,
                        "origin": self.origins.get(s.name, "default")})
        return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    for s in SETTINGS:
        # default None so "not given" is distinguishable from "given the default"
        parser.add_argument(s.flag, dest=s.name, default=None, metavar="VALUE",
                            help=f"{s.help} (env {s.env}; default {s.default!r})")


def resolve(flags: Mapping[str, str | None], environ: Mapping[str, str] | None = None) -> Settings:
    """flags > environment > defaults. Raises ConfigError naming the flag for a bad flag value."""
    environ = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    origins: dict[str, str] = {}
    for s in SETTINGS:
        raw_flag = flags.get(s.name)
        if raw_flag is not None:
            try:
                values[s.name] = s.parse(raw_flag)
            except ValueError as exc:
                raise ConfigError(f"{s.flag}: {exc}") from None
            origins[s.name] = "flag"
            continue
        raw_env = environ.get(s.env)
        if raw_env is not None and raw_env.strip() != "":
            try:
                values[s.name] = s.parse(raw_env)
                origins[s.name] = "env"
                continue
            except ValueError as exc:
                log.warning("ignoring %s=%r (%s); using the default %r", s.env, raw_env, exc, s.default)
        values[s.name] = s.default
        origins[s.name] = "default"
    settings = Settings(**values, origins=origins)
    _check_combination(settings)
    return settings


def _check_combination(settings: Settings) -> None:
    if "lmcache" in settings.prefix_source and not settings.lmcache_url:
        raise ConfigError("--prefix-source: lmcache needs --lmcache-url")
    if not settings.listen:
        raise ConfigError("--listen: the gRPC server needs an address")
    _check_addresses(settings)
    if settings.endpoints and settings.endpoints_file:
        raise ConfigError("--endpoints-file: give either --endpoints or --endpoints-file, not both")
    if settings.scrape_stale_s < settings.scrape_interval_s:
        raise ConfigError("--scrape-stale-s: must be at least --scrape-interval-s")
    if settings.ejection_max_s < settings.ejection_base_s:
        raise ConfigError("--ejection-max-s: must be at least --ejection-base-s")
    if bool(settings.tls_cert) != bool(settings.tls_key):
        raise ConfigError("--tls-key: --tls-cert and --tls-key go together")
    if settings.tls_client_ca and not settings.tls_cert:
        raise ConfigError("--tls-client-ca: mutual TLS needs --tls-cert and --tls-key")
    _check_discovery(settings)


LISTENERS = ("listen", "health_listen", "metrics_listen", "admin_listen", "admin_http_listen")
ANY_HOST = ("", "0.0.0.0", "::", "*")


def _check_addresses(settings: Settings) -> None:
    """Each listener on an address of its own (port 0 asks for any free port, so it never clashes)."""
    seen: list[tuple[str, str, int]] = []
    for name in LISTENERS:
        address = getattr(settings, name)
        if not address:
            continue
        host, _, port_text = address.rpartition(":")
        host, port = host.strip("[]"), int(port_text)
        for other, other_host, other_port in seen:
            if port and port == other_port and (host == other_host or host in ANY_HOST or other_host in ANY_HOST):
                flag, other_flag = SETTINGS_BY_NAME[name].flag, SETTINGS_BY_NAME[other].flag
                raise ConfigError(f"{flag}: {address} is also {other_flag}'s address; give each its own port")
        seen.append((name, host, port))


def _check_discovery(settings: Settings) -> None:
    mode = settings.discovery_mode
    if mode == "file" and not settings.endpoints_file:
        raise ConfigError("--discovery: file needs --endpoints-file")
    if mode in ("envoy-admin", "kubernetes", "inference-pool") and (settings.endpoints or settings.endpoints_file):
        raise ConfigError(f"--discovery: {mode} finds the endpoints itself; drop --endpoints / --endpoints-file")
    if mode == "static" and settings.endpoints_file:
        raise ConfigError("--discovery: static takes --endpoints; use --discovery file for --endpoints-file")
    if mode == "envoy-admin" and not settings.envoy_admin_url:
        raise ConfigError("--envoy-admin-url: --discovery envoy-admin needs Envoy's admin address")
    if mode == "kubernetes" and not settings.k8s_service:
        raise ConfigError("--k8s-service: --discovery kubernetes needs the engines' Service name")
    if mode == "inference-pool" and not settings.inference_pool:
        raise ConfigError("--inference-pool: --discovery inference-pool needs the InferencePool's name")


def from_args(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> Settings:
    parser = argparse.ArgumentParser(prog="loadaware-sidecar serve")
    add_arguments(parser)
    ns = parser.parse_args(argv)
    return resolve(vars(ns), environ)
