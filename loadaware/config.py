"""The one settings object: command-line flag > environment variable > default, validated at start.

A bad flag value is refused with a message naming the flag. A bad environment value of a tuning knob falls
back to the default with a warning (an unparsable LOADAWARE_BETA in a pod spec must not take the gateway
down); one of a listener, TLS or ejection setting is refused like a flag (`Setting.strict` says why).
Every value remembers where it came from, so the effective configuration can be explained.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

from loadaware.fleet.addresses import (
    FeedAddress,
    format_hostport,
    parse_endpoint_list,
    parse_feed_map,
    parse_hostport,
    parse_instance_map,
    parse_topic_map,
)
from loadaware.fleet.discovery.registry import discovery_help, discovery_problem, in_cluster, modes
from loadaware.fleet.health import HealthOptions
from loadaware.policies import POLICIES
from loadaware.policies.auto import AUTO, auto_policy
from loadaware.prefix.blocks import DEFAULT_MAX_BLOCKS
from loadaware.prefix.registry import (
    SOURCES,
    default_reason,
    default_sources,
    prefix_source_help,
    selection_problem,
)
from loadaware.routing.builder import CoreOptions

log = logging.getLogger(__name__)


class ConfigError(ValueError):
    """A setting that cannot be used; the message names the flag."""


# ---- value parsers: each raises ValueError with a short reason ----

def parse_discovery(text: str) -> str:
    mode = text.strip().lower()
    if mode not in modes():  # the registry itself: a backend added there is accepted here
        raise ValueError(f"{text!r}: expected one of {', '.join(modes())}")
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
    if text != AUTO and text not in POLICIES:  # the registry itself: a policy added there is accepted here
        raise ValueError(f"{text!r}: expected {AUTO} or one of {', '.join(POLICIES)}")
    return text


def policy_help() -> str:
    """--policy's help, from the registry: a policy registered there is named here."""
    return f"{' | '.join((AUTO, *POLICIES))} (auto: {auto_policy(True)[0]}; docs/policies.md)"


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


# RFC 9110's token characters: what a header field name may hold (no pseudo-header, no space, no colon).
_TCHARS = frozenset("!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyz")


def parse_session_header(text: str) -> str:
    """A header field name, lower-cased as Envoy hands names over; empty: session affinity off."""
    name = text.strip().lower()
    if name and not set(name) <= _TCHARS:
        raise ValueError(f"{text!r} is not a valid HTTP header name (letters, digits, !#$%&'*+-.^_`|~)")
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
    return format_hostport(host, port)


def parse_otlp_endpoint(text: str) -> str:
    """An OTLP/HTTP collector's address (its base, or its /v1/traces URL); '', off or none: tracing off."""
    if text.strip().lower() in ("", "off", "none"):
        return ""
    return parse_url(text)


def parse_ratio(text: str) -> float:
    value = float(text)
    if not math.isfinite(value) or not 0 <= value <= 1:
        raise ValueError(f"{text!r} must be a number from 0 to 1")
    return value


def parse_prefix_sources(text: str) -> tuple[str, ...]:
    """Sources of the registry (prefix/registry.py), one or a comma combination; `auto` (or empty) = the
    default."""
    items = [t.strip().lower() for t in text.split(",") if t.strip()]
    if not items or items == ["auto"]:
        return ()
    unknown = [t for t in items if t not in SOURCES]
    if unknown:
        raise ValueError(f"{', '.join(unknown)}: expected a comma list of {', '.join(SOURCES)}")
    return tuple(s for s in SOURCES if s in items)  # canonical order, no duplicates


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


def parse_reserve(text: str) -> int | None:
    """auto (None: sized at run time) or a count >= 0."""
    return None if text.strip() == "auto" else parse_count(text)


NO_ENDPOINT_REPLIES = ("auto", "unavailable", "fallback")


def parse_no_endpoint_reply(text: str) -> str:
    value = text.strip().lower()
    if value not in NO_ENDPOINT_REPLIES:
        raise ValueError(f"{text!r}: expected one of {', '.join(NO_ENDPOINT_REPLIES)}")
    return value


def parse_percent(text: str) -> float:
    value = float(text)
    if not math.isfinite(value) or not 0 <= value <= 100:
        raise ValueError(f"{text!r} must be a percentage from 0 to 100")
    return value


def parse_on_off(text: str) -> bool:
    value = text.strip().lower()
    if value in ("on", "true", "1", "yes"):
        return True
    if value in ("off", "false", "0", "no"):
        return False
    raise ValueError(f"{text!r}: expected on or off")


def parse_positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise ValueError(f"{text!r} must be a positive integer")
    return value


@dataclass(frozen=True)
class Setting:
    default: Any
    parse: Callable[[str], Any]
    # The help text, or what derives it from a registry when asked (so a policy, prefix source or discovery
    # backend registered there is named in --help and docs/configuration.md).
    help_text: str | Callable[[], str]
    # A bad environment value of a strict setting is refused at start like a flag: a listener on a default
    # address the operator did not mean, a TLS file silently dropped (plain text instead of TLS) or an ejection
    # rule quietly reset would each change the pod's exposure or failure behaviour without a sign. Tuning knobs
    # (beta, intervals) fall back to their default with a warning.
    strict: bool = False
    flag: str = ""  # default: --NAME, dashes for underscores
    env: str = ""  # default: LOADAWARE_NAME
    name: str = ""  # the Settings field; set by named()

    @property
    def help(self) -> str:
        return self.help_text if isinstance(self.help_text, str) else self.help_text()

    def named(self, name: str) -> Setting:
        return replace(self, name=name, flag=self.flag or "--" + name.replace("_", "-"),
                       env=self.env or "LOADAWARE_" + name.upper())


def setting(default: Any, parse: Callable[[str], Any], help: str | Callable[[], str], *, strict: bool = False,
            flag: str = "", env: str = "") -> Any:
    """A Settings field: its default and, in the field's metadata, how it is given and parsed."""
    spec = {"setting": Setting(default, parse, help, strict, flag, env)}
    if isinstance(default, dict):
        return field(default_factory=dict, metadata=spec)
    return field(default=default, metadata=spec)


@dataclass(frozen=True)
class Settings:
    """Every setting in one table: its type and default here, with its parser, help, flag (--NAME with dashes)
    and environment variable (LOADAWARE_NAME) in `setting(...)`; SETTINGS is derived from these fields."""

    listen: str = setting("127.0.0.1:9002", parse_optional_hostport,
            "gRPC address for ext_proc and health (the debug API is on --admin-listen)", strict=True)
    endpoints: tuple[str, ...] = setting((), parse_endpoint_list,
            "engines as Envoy's cluster names them: HOST:PORT,...", strict=True)
    endpoints_file: str = setting("", parse_path,
            "file of HOST:PORT lines or commas, re-read when it changes")
    # Endpoint discovery (loadaware/fleet/discovery/); the default follows --endpoints / --endpoints-file.
    discovery: str = setting("", parse_discovery, discovery_help, strict=True)
    envoy_admin_url: str = setting("", parse_url,
            "envoy-admin discovery: Envoy's admin API, e.g. http://127.0.0.1:9901", strict=True)
    envoy_cluster: str = setting("engines", parse_name,
            "envoy-admin discovery: the cluster whose hosts are the engines")
    discovery_interval_s: float = setting(1.0, parse_positive,
            "envoy-admin discovery: polling period")
    k8s_namespace: str = setting("", parse_name,
            "kubernetes discovery: the Service's namespace (default: the pod's own)")
    k8s_service: str = setting("", parse_name,
            "kubernetes discovery: the engines' Service (its EndpointSlices are watched)")
    k8s_port_name: str = setting("", parse_name,
            "kubernetes discovery: the Service port Envoy sends to (default: the only one)")
    kubeconfig: str = setting("", parse_path,
            "kubernetes discovery outside a cluster: kubeconfig file (default: in-cluster service account)")
    inference_pool: str = setting("", parse_name,
            "inference-pool discovery: the InferencePool whose pods are the engines (in --k8s-namespace)")
    policy: str = setting(AUTO, parse_policy, policy_help, strict=True)
    loadaware_beta: float = setting(1.0, parse_beta,
            "exchange rate between prefix benefit and relative load (>= 0)", env='LOADAWARE_BETA')
    lmcache_url: str = setting("", parse_url,
            "LMCache controller HTTP API, e.g. http://127.0.0.1:9000", strict=True)
    lmcache_instance_map: Mapping[str, str] = setting({}, parse_instance_map,
            "explicit LMCache instance ids: ID=HOST:PORT,...")
    lmcache_timeout_ms: float = setting(100.0, parse_positive,
            "time box for one LMCache lookup")
    instance_refresh_s: float = setting(30.0, parse_positive,
            "period of the LMCache worker-info refresh (sooner when stale)")
    tokenizer: str = setting("", parse_path,
            "tokenizer.json, or a model folder holding it and tokenizer_config.json")
    tokenizer_timeout_ms: float = setting(200.0, parse_positive,
            "time box for one tokenization")
    tokenize_max_chars: int = setting(65_536, parse_count,
            "a longer prompt is tokenized up to this many characters: prefix caches can match only that head, "
            "and the prompt's length in tokens is estimated from the head's tokens per character (0: whole)")
    tokenizer_inline_chars: int = setting(2048, parse_count,
            "a prompt whose uncached part is at most this many characters is tokenized on the event "
            "loop (cheaper than a thread hop); longer ones in a worker thread (0: always a thread)")
    tokenizer_cache_tokens: int = setting(2_000_000, parse_count,
            "token ids of shared prompt pieces the tokenizer keeps, so a prompt that shares a long prefix with "
            "earlier ones encodes only its new text (a piece is kept from its second sighting; least recently "
            "used first out; ~12 bytes a token with its text; 0: off)")
    conversation_cache_mb: int = setting(32, parse_count,
            "MiB of token ids of rendered conversations kept at message boundaries, so a chat that extends an "
            "earlier one encodes only its new text and --tokenize-max-chars counts only that (~4 bytes a token; "
            "0: off)")
    metrics_listen: str = setting("127.0.0.1:9102", parse_optional_hostport,
            "Prometheus /metrics address, nothing else ('off' to disable)", strict=True)
    # The debug API can tell whether a prompt was recently served: keep it on loopback (kubectl port-forward).
    admin_listen: str = setting("127.0.0.1:9004", parse_optional_hostport,
            "gRPC address of the debug API (loadaware.v1.Router), reflection and health; loopback ('off' to disable)",
            strict=True)
    admin_http_listen: str = setting("127.0.0.1:9005", parse_optional_hostport,
            "HTTP address of /debug/decisions and /debug/state; loopback ('off' to disable)", strict=True)
    destination_header: str = setting("x-gateway-destination-endpoint", parse_header_name,
            "header Envoy's override_host reads")
    # Session affinity (routing/affinity.py): off unless a header is named.
    session_header: str = setting("", parse_session_header,
            "request header whose value is a session key: a session's requests go to the endpoint that served it "
            "while it is a candidate and not saturated, else they move and the session follows ('' = off)",
            strict=True)
    session_max_entries: int = setting(100_000, parse_positive_int,
            "session affinity: most sessions remembered (the least recently used is forgotten first)")
    session_ttl_s: float = setting(600.0, parse_positive,
            "session affinity: a session idle this long is forgotten")
    state_max_entries: int = setting(100_000, parse_positive_int,
            "stored responses (Responses API) whose holder is remembered (least recently used forgotten first; "
            "~260 bytes each)")
    state_ttl_s: float = setting(86_400.0, parse_positive,
            "a stored response's holder is remembered this long after it was learned or last used")
    state_probe_timeout_s: float = setting(0.5, parse_positive,
            "time box for asking the engines which one holds a stored response the sidecar does not know")
    fallback_endpoints: int = setting(2, parse_count,
            "next-best endpoints named after the choice, for the proxy's retries to walk (0 = the choice only)")
    no_endpoint_reply: str = setting("auto", parse_no_endpoint_reply,
            "nobody to route to: unavailable (503), fallback (the proxy's own "
            "fallback picks), auto (503 in full-duplex picker mode, fallback in BUFFERED mode)")
    max_request_body_bytes: int = setting(8 * 1024 * 1024, parse_positive_int,
            "largest request body (413 beyond): held in full-duplex mode; in BUFFERED mode Envoy's own limit "
            "comes first")
    max_open_streams: int = setting(4096, parse_count,
            "ext_proc streams open at once (every request in flight holds one until its response ends, ~24 KiB "
            "each); past it a new request is answered 503 with Retry-After at once, so engines that stop answering "
            "cannot pile requests into the sidecar until it runs out of memory (0: no cap)")
    # Admission under saturation (loadaware/admission): hold, release by priority and fairness id, shed with 429.
    admission: bool = setting(False, parse_on_off,
            "on: while every eligible engine is saturated (--saturation-queue), hold requests on their stream and "
            "release them highest priority first, round robin across x-gateway-inference-fairness-id; shed "
            "sheddable ones (priority < 0) with 429 past the bounds below")
    objectives: str = setting("", parse_path,
            "JSON or YAML file of objectives and their priorities: {\"<objective>\": {\"priority\": <int>}}; a "
            "request names its objective in x-gateway-inference-objective (none or unknown: priority 0)")
    watch_objectives: bool = setting(True, parse_on_off,
            "with --admission on and kubernetes or inference-pool discovery: watch the InferenceObjective "
            "resources of the namespace (those of --inference-pool when named) for priorities, over the file's")
    saturation_queue: int = setting(0, parse_count,
            "requests an engine may queue beyond its batch before it counts as saturated (its batch: the "
            "vllm:num_requests_running its scrape showed while some waited); 0: saturated once its batch is full")
    reserved_slots: int | None = setting(None, parse_reserve,
            "free batch slots the lower bands leave to the highest priority the objectives define, so that its "
            "requests find one while lower ones are held. auto: over the pool, the fewest that keep 1% of its "
            "requests at most from finding none, from its requests in flight over the engines' batch slots; N: N "
            "per engine plus one per request of that priority in flight (0 = none)")
    late_reserved_slots: int | None = setting(None, parse_reserve,
            "the free slots a request held past --admission-ttl-s (not sheddable, released late, before its band) "
            "leaves to the highest priority. auto: with --reserved-slots auto the fewest that keep 5% of its "
            "requests at most from finding none, else min(1, --reserved-slots) per engine; N: N per engine (at "
            "most --reserved-slots); 0: a late request may take any free slot")
    admission_max_held: int = setting(5_000, parse_positive_int,
            "most requests held at once (past it: a lower-priority sheddable one is evicted, a sheddable arrival "
            "gets 429, any other is placed at once)")
    admission_max_held_bytes: int = setting(256 * 1024 * 1024, parse_positive_int,
            "most body bytes held at once (as --admission-max-held)")
    admission_ttl_s: float = setting(30.0, parse_positive,
            "longest a request is held: then a sheddable one gets 429, any other is placed anyway; Envoy's "
            "max_message_timeout (BUFFERED) must be at least this plus 5 s")
    scrape_interval_s: float = setting(1.0, parse_positive,
            "period of the engines' /metrics scrape")
    scrape_timeout_ms: float = setting(500.0, parse_positive,
            "time box for one engine scrape")
    scrape_stale_s: float = setting(5.0, parse_positive,
            "a scrape older than this is ignored")
    eject_after_failures: int = setting(3, parse_count,
            "consecutive failed requests (5xx, timeout, passed over by the proxy's retries) that take an engine "
            "out of rotation (0 = never)", strict=True)
    ejection_base_s: float = setting(1.0, parse_positive,
            "first ejection's length; each further one in a row doubles it, up to --ejection-max-s",
            strict=True)
    ejection_max_s: float = setting(5.0, parse_positive,
            "longest ejection: a healed engine is probed, and back, within about this long", strict=True)
    unreachable_after_scrapes: int = setting(2, parse_count,
            "consecutive scrapes that time out or cannot connect that take an engine out until a "
            "scrape succeeds (0 = never)", strict=True)
    max_ejection_percent: float = setting(50.0, parse_percent,
            "at most this share of a decision's candidates is out of rotation (as Envoy's outlier detection); "
            "past it, the engines due back soonest take traffic again (at least one engine can be out)",
            strict=True)
    models_refresh_s: float = setting(10.0, parse_non_negative,
            "period of the engines' /v1/models fetch (the request's model selects its engines; 0 = off, "
            "every engine serves every model)")
    shutdown_grace_s: float = setting(10.0, parse_positive,
            "how long SIGTERM waits for open streams")
    health_listen: str = setting("", parse_optional_hostport,
            "extra plain-text gRPC port serving only grpc.health.v1 (kubelet's gRPC probes speak no TLS)",
            strict=True)
    tls_cert: str = setting("", parse_path,
            "PEM certificate chain: serve the gRPC port over TLS (gateways that dial their picker with TLS)",
            strict=True)
    tls_key: str = setting("", parse_path,
            "PEM private key for --tls-cert", strict=True)
    tls_client_ca: str = setting("", parse_path,
            "PEM CA bundle: require and verify client certificates (mutual TLS)", strict=True)
    prefix_source: tuple[str, ...] = setting((), parse_prefix_sources, prefix_source_help, strict=True)
    kv_events_port: int = setting(5557, parse_port,
            "port of each engine's vLLM KV-event PUB socket, on the endpoint's host (0 = explicit map only)")
    kv_events_replay_port: int = setting(5558, parse_port,
            "port of each engine's KV-event replay (ROUTER) socket (0 = none)")
    kv_events_endpoints: Mapping[str, FeedAddress] = setting({}, parse_feed_map,
            "explicit publishers: ENDPOINT=HOST:PUB_PORT[/REPLAY_PORT][@FIRST[-LAST] ranks],...", strict=True)
    kv_events_dp_ranks: int = setting(1, parse_positive_int,
            "data-parallel ranks behind each endpoint: ranks 0..N-1 publish on the KV-event ports + rank; "
            "an endpoint is credited with the minimum over its ranks")
    kv_events_topic: str = setting("", str,
            "KV-event topic to subscribe to (vLLM's default is empty)")
    kv_events_max_blocks: int = setting(DEFAULT_MAX_BLOCKS, parse_positive_int,
            "memory bound of the KV-events index, in blocks over all engines (~370 B each; docs/memory.md)")
    kv_events_replay_timeout_ms: float = setting(2000.0, parse_positive,
            "time box for one replay")
    # The engines-connect pattern (prefix/kvevents/inbound.py): engines whose KV-events endpoint is this address.
    kv_events_bind: str = setting("", parse_optional_hostport,
            "HOST:PORT of a SUB socket the engines' KV-event publishers connect to (vLLM endpoint "
            "tcp://<sidecar>:PORT, topic kv@<ip>@<model>); engines not in --kv-events-endpoints are fed only here",
            strict=True)
    kv_events_topic_map: Mapping[str, str] = setting({}, parse_topic_map,
            "engines-connect: TOPIC=HOST:PORT,... names the endpoint publishing each topic (default: kv@<ip>@<model> "
            "names the fleet's endpoint on <ip>)")
    approx_capacity_tokens: int = setting(100_000, parse_positive_int,
            "approximate source: each engine's prefix-cache capacity, in tokens")
    approx_ttl_s: float = setting(300.0, parse_positive,
            "approximate source: a guessed block not routed to for this long is forgotten")
    approx_max_blocks: int = setting(500_000, parse_positive_int,
            "approximate source: memory bound over all engines, in blocks (~190 B each; docs/memory.md)")
    log_level: str = setting("INFO", parse_log_level,
            "debug logs every decision")
    # Traces (telemetry/tracing.py): off unless a collector is named.
    otlp_endpoint: str = setting("", parse_otlp_endpoint,
            "OTLP/HTTP collector, e.g. http://127.0.0.1:4318: export a span per routing decision there (OTLP JSON, "
            "POST <endpoint>/v1/traces) and send each routed request upstream with a traceparent naming it ('' = "
            "off)", strict=True)
    trace_sample_ratio: float = setting(1.0, parse_ratio,
            "share of new traces sampled (0 to 1); a request whose traceparent says sampled is always traced, one "
            "that says not sampled never is")
    # Memory under steady load (collector.py): grpc.aio's per-RPC cycles reach the old generation; free them.
    gc_full_interval_s: float = setting(30.0, parse_non_negative,
            "period of a full garbage collection on the event loop (~13 ms of CPU measured) and a malloc-heap trim in "
            "a worker thread (~1 ms); 0 = leave it to CPython's own schedule, under which grpc's per-RPC cycles "
            "pile up")
    malloc_arena_max: int = setting(2, parse_count,
            "at most this many glibc malloc arenas (mallopt M_ARENA_MAX, set at start): threads share them instead "
            "of each keeping its own freed pages resident; 0 = glibc's default (8 per core)")
    # Diagnostics for memory growth (telemetry/memory_snapshots.py); off by default: tracing slows the sidecar.
    tracemalloc_dir: str = setting("", parse_path,
            "trace allocations and write a tracemalloc snapshot and live-object counts into this folder")
    tracemalloc_interval_s: float = setting(60.0, parse_positive, "period of the --tracemalloc-dir snapshots")
    # where each value came from: "flag", "env" or "default"
    origins: Mapping[str, str] = field(default_factory=dict)

    @property
    def prefix_sources(self) -> tuple[str, ...]:
        """The prefix sources in effect: the flag's; else `auto`'s (prefix/registry.py: every source its options
        select and that can be asked; with a tokenizer and --lmcache-url, LMCache and the sidecar's own record
        beside it, else the record alone)."""
        if self.prefix_source:
            return self.prefix_source
        return default_sources(self, bool(self.tokenizer))

    @property
    def prefix_reason(self) -> str:
        """Why the prefix sources in effect are the ones: the operator's flag, or the default's reason."""
        if self.prefix_source:
            return "--prefix-source"
        return default_reason(self, bool(self.tokenizer))

    @property
    def effective_policy(self) -> str:
        """--policy, or what `auto` chose for this configuration (policies/auto.py)."""
        return auto_policy(bool(self.tokenizer))[0] if self.policy == AUTO else self.policy

    @property
    def policy_reason(self) -> str:
        """Why the policy in effect is the one: the operator's choice, or `auto`'s reason."""
        return auto_policy(bool(self.tokenizer))[1] if self.policy == AUTO else f"--policy {self.policy}"

    @property
    def discovery_mode(self) -> str:
        """--discovery, or what --endpoints / --endpoints-file imply."""
        return self.discovery or ("file" if self.endpoints_file else "static")

    @property
    def objectives_from_cluster(self) -> bool:
        """Whether the InferenceObjective resources are watched: admission on, Kubernetes discovery, not refused."""
        return self.admission and self.watch_objectives and in_cluster(self.discovery_mode)

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
            if s.name == "policy" and value == AUTO:
                value = f"{self.effective_policy} ({self.policy_reason})"
            if s.name == "prefix_source" and not value:
                value = f"{','.join(self.prefix_sources)} ({self.prefix_reason})"
            out.append({"name": s.name, "flag": s.flag, "env": s.env, "value": value,
                        "origin": self.origins.get(s.name, "default")})
        return out


SETTINGS: tuple[Setting, ...] = tuple(f.metadata["setting"].named(f.name) for f in fields(Settings)
                                      if "setting" in f.metadata)

SETTINGS_BY_NAME = {s.name: s for s in SETTINGS}





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
                if s.strict:
                    raise ConfigError(f"{s.env}: {exc}") from None
                log.warning("ignoring %s=%r (%s); using the default %r", s.env, raw_env, exc, s.default)
        values[s.name] = s.default
        origins[s.name] = "default"
    settings = Settings(**values, origins=origins)
    _check_combination(settings)
    return settings


def _check_combination(settings: Settings) -> None:
    problem = selection_problem(settings.prefix_sources, settings)  # each source's own rules (prefix/registry.py)
    if problem:
        raise ConfigError(problem)
    if not settings.listen:
        raise ConfigError("--listen: the gRPC server needs an address")
    if settings.session_header and settings.session_header == settings.destination_header:
        raise ConfigError("--session-header: the destination header is the sidecar's own answer, not a session key")
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
        host, port = parse_hostport(address)
        for other, other_host, other_port in seen:
            if port and port == other_port and (host == other_host or host in ANY_HOST or other_host in ANY_HOST):
                flag, other_flag = SETTINGS_BY_NAME[name].flag, SETTINGS_BY_NAME[other].flag
                raise ConfigError(f"{flag}: {address} is also {other_flag}'s address; give each its own port")
        seen.append((name, host, port))


def _check_discovery(settings: Settings) -> None:
    problem = discovery_problem(settings.discovery_mode, settings)  # the backend's own rules (discovery/registry.py)
    if problem:
        raise ConfigError(problem)


def from_args(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> Settings:
    parser = argparse.ArgumentParser(prog="loadaware-sidecar serve")
    add_arguments(parser)
    ns = parser.parse_args(argv)
    return resolve(vars(ns), environ)


def core_options(s: Settings) -> CoreOptions:
    """What the decision core reads of the settings (loadaware/routing/builder.py): the sidecar and the simulator
    build it from the same table."""
    return CoreOptions(
        policy=s.effective_policy, beta=s.loadaware_beta, fallbacks=s.fallback_endpoints,
        scrape_stale_s=s.scrape_stale_s,
        health=HealthOptions(s.eject_after_failures, s.ejection_base_s, s.ejection_max_s, s.unreachable_after_scrapes,
                             s.max_ejection_percent),
        models_refresh_s=s.models_refresh_s, sessions=bool(s.session_header),
        session_max_entries=s.session_max_entries, session_ttl_s=s.session_ttl_s,
        state_max_entries=s.state_max_entries, state_ttl_s=s.state_ttl_s,
        state_probe_timeout_s=s.state_probe_timeout_s)
