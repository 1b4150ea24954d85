"""The composition root: every object is built and wired here, and nowhere else reads the configuration.

Then the lifecycle of the process: start the servers and background tasks; on SIGTERM report NOT_SERVING,
stop accepting streams, let open ones finish within the grace, and release every count.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from collections.abc import Callable, Coroutine, Mapping
from typing import TYPE_CHECKING, Any

import grpc

from loadaware.admission.controller import AdmissionController, AdmissionSettings
from loadaware.admission.objectives import Objectives, ObjectivesError, load_objectives
from loadaware.admission.saturation import PoolRoom
from loadaware.api.admin import admin_server, is_loopback
from loadaware.api.debug_http import DebugHttp, MetricsHttp
from loadaware.api.metrics_page import MetricsPage, pool_loads
from loadaware.api.servicer import RouterServicer
from loadaware.api.state_page import StatePage
from loadaware.api.view import DecisionView, FleetView, PrefixView, ProcessView, SidecarView
from loadaware.collector import FullCollections
from loadaware.config import Settings, core_options
from loadaware.extproc.conversation import StreamOptions
from loadaware.extproc.health import HealthReporter
from loadaware.extproc.stream import ExtProcServicer
from loadaware.fleet.discovery.catalog import DiscoveryCatalog
from loadaware.fleet.discovery.metrics import DiscoveryMetrics
from loadaware.fleet.discovery.registry import discovery_tasks
from loadaware.fleet.discovery.spec import DiscoveryContext
from loadaware.fleet.models_poller import ModelsPoller
from loadaware.fleet.registry import EndpointRegistry, FleetEvents
from loadaware.fleet.state_probe import EngineStateProbe
from loadaware.lifecycle import RequestLifecycle
from loadaware.load.scraper import MetricsScraper
from loadaware.prefix.lmcache.bridge import InstanceBridge
from loadaware.prefix.sources.lmcache import instance_resolver
from loadaware.prefix.spec import BuildContext
from loadaware.prefix.wiring import PrefixOptions, PrefixWiring
from loadaware.routing.builder import CoreInputs, build_core
from loadaware.routing.producers import PromptEncoder
from loadaware.runtime.listeners import add_listener, bind
from loadaware.runtime.readiness import Readiness, is_required
from loadaware.tasks.supervisor import Supervisor, TaskSpec
from loadaware.telemetry.decisions import DecisionLog, DecisionMetrics, RecentDecisions
from loadaware.telemetry.epp import EppMetrics
from loadaware.telemetry.faults import ListenerFailures
from loadaware.telemetry.memory_snapshots import MemorySnapshots
from loadaware.telemetry.metrics import Metrics
from loadaware.tokenize.conversation import ConversationTokens
from loadaware.tokenize.text_units import TextUnits
from loadaware.tokenize.tokenizer import AsyncTokenizer, PromptTokenizer

if TYPE_CHECKING:
    from loadaware.telemetry.tracing import Tracing

log = logging.getLogger(__name__)

GRPC_MAX_MESSAGE_BYTES = 64 * 1024 * 1024  # request bodies arrive whole in BUFFERED mode

Task = Callable[[], Coroutine[Any, Any, None]]


class Wiring:
    """Every object of the sidecar, built from the settings and wired together, and what a change of the fleet
    means to each; Sidecar runs what this builds."""

    def __init__(self, settings: Settings) -> None:
        self.settings = s = settings
        # Each step builds one part from the settings and the parts before it: the order is the wiring's.
        self._build_telemetry(s)
        self._build_fleet(s)
        self._build_prefixes(s)
        self._build_decision(s)
        self._subscribe_to_requests(s)
        self._follow_the_fleet(s)
        self._build_serving(s)
        self._build_api(s)

    # ---- the build steps, in order ----
    def _build_telemetry(self, s: Settings) -> None:
        """Memory snapshots first (all that follows is traced), the metrics, the request lifecycle, the
        background tasks' supervisor."""
        self.memory_snapshots = MemorySnapshots(s.tracemalloc_dir, s.tracemalloc_interval_s) \
            if s.tracemalloc_dir else None
        if self.memory_snapshots is not None:
            self.memory_snapshots.start_tracing()  # first, so everything built below is traced
        self.metrics = Metrics(s.effective_policy)
        self.full_collections = FullCollections(s.gc_full_interval_s, self.metrics.registry, freeze_survivors=True) \
            if s.gc_full_interval_s > 0 else None
        self.lifecycle = RequestLifecycle()
        self.lifecycle.on_failure = ListenerFailures(self.metrics.fallback)  # counted, logged rate-limited
        # Every background task runs under it, those that come and go with the fleet (KV-event feeds) too.
        self.supervisor = Supervisor(self.metrics.registry)

    def _build_fleet(self, s: Settings) -> None:
        """The fleet's membership, and how a stored response's holder is asked for (Responses API: learned from
        the responses, found by asking the engines otherwise)."""
        self.registry = EndpointRegistry(s.endpoints)
        self.state_probe = EngineStateProbe(s.state_probe_timeout_s)

    def _build_prefixes(self, s: Settings) -> None:
        """The tokenizer and the prefix sources (LMCache's instance map and client among them)."""
        self.bridge = InstanceBridge(s.lmcache_instance_map)
        self.bridge.set_endpoints(self.registry.snapshot())
        prompts = PromptTokenizer(s.tokenizer, max_cached_tokens=s.tokenizer_cache_tokens) if s.tokenizer else None
        self.tokenizer = AsyncTokenizer(prompts, s.tokenizer_timeout_ms / 1e3, inline_chars=s.tokenizer_inline_chars,
                                        max_chars=s.tokenize_max_chars, conversations=ConversationTokens(
                                            prompts, s.conversation_cache_mb << 20)
                                        if s.conversation_cache_mb else None) if prompts else None
        # --prefix-source: the registry's sources (prefix/registry.py), each reading its own settings.
        self.prefixes = PrefixWiring(PrefixOptions(s.prefix_sources, bool(s.tokenizer), settings=s),
                                     BuildContext(self.metrics, self.registry.snapshot, self.bridge,
                                                  self.supervisor.spawn))
        self.resolver = instance_resolver(self.prefixes.parts)  # LMCache's instance map: readiness waits for it

    def _build_decision(self, s: Settings) -> None:
        """The decision core, by the builder the simulator uses too (routing/builder.py): loads, token signals,
        routing health, models, stored responses' holders, session affinity and the Decider, subscribed to the
        lifecycle (counts first: a later listener failing must not leak one); then the models' poller."""
        encoder: PromptEncoder | None = self.tokenizer
        if encoder is None and self.prefixes.text_will_do:
            encoder = TextUnits()  # sources that need no tokenizer (the approximate one) may guess from text
        self.core = build_core(core_options(s), CoreInputs(
            self.registry, self.lifecycle, tokenizer=encoder, prefix_source=self.prefixes.source,
            prefix_listeners=tuple(self.prefixes.lifecycle_listeners()), probe=self.state_probe,
            on_health_change=self._health_changed))
        self.decider, self.loads, self.signals = self.core.decider, self.core.loads, self.core.signals
        self.endpoint_health, self.models, self.state_holders = self.core.health, self.core.models, self.core.state
        # The request's model selects its engines (--models-refresh-s 0: off, every engine serves anything).
        self.models_poller = ModelsPoller(self.registry, self.models, self.metrics, s.models_refresh_s,
                                          s.scrape_timeout_ms / 1e3) if self.models is not None else None

    def _subscribe_to_requests(self, s: Settings) -> None:
        """Who else hears about each request, after the decision core's own listeners."""
        self.recent = RecentDecisions()
        decision_metrics = DecisionMetrics(self.metrics)
        self.lifecycle.subscribe(decision_metrics)
        self.lifecycle.subscribe_outcomes(decision_metrics)
        self.lifecycle.subscribe(DecisionLog())
        # The endpoint picker's metric names too (inference_pool_*, inference_objective_*): gateways' dashboards.
        self.lifecycle.subscribe(EppMetrics(self.metrics.registry, s.inference_pool or s.k8s_service or "default",
                                            lambda: pool_loads(self.view.fleet),
                                            self.metrics.decision_seconds, time.time))
        self.lifecycle.subscribe(self.recent)
        self.admission = self._admission(s)

    def _follow_the_fleet(self, s: Settings) -> None:
        """Scrapes, the endpoints file, fleet events and discovery: how the fleet and its loads are learned."""
        self.scraper = MetricsScraper(self.registry, self.loads, self.metrics, s.scrape_interval_s,
                                      s.scrape_timeout_ms / 1e3, health=self.endpoint_health)
        # Discovery is built first: the endpoints file's first set is in before the subscription below.
        self.catalog, self._discovery_tasks = self._discovery(s)
        # Fleet changes arrive as events (fleet/registry.py): nobody polls the registry.
        self.registry.subscribe(FleetEvents(removed=self._endpoint_removed, changed=self._endpoints_changed))
        for listener in self.prefixes.fleet_listeners():  # the KV-event feeds follow the fleet
            self.registry.subscribe(listener)
        self.bridge.set_endpoints(self.registry.snapshot())

    def _build_serving(self, s: Settings) -> None:
        """Readiness, the ext_proc server and its health, and tracing (--otlp-endpoint)."""
        self.readiness = Readiness(self.registry, self.scraper, self.supervisor, self.models_poller, self.resolver)
        self.extproc = ExtProcServicer(self.decider, self.lifecycle, self.metrics, s.destination_header,
                                       StreamOptions(s.no_endpoint_reply, s.max_request_body_bytes,
                                                     session_header=s.session_header,
                                                     max_open_streams=s.max_open_streams),
                                       admission=self.admission)
        self.health = HealthReporter(self.readiness.ready, self.readiness.reason)
        self.metrics.open_streams.set_function(lambda: self.extproc.open_streams)  # read at each scrape
        self.metrics.state_holders.set_function(lambda: len(self.state_holders))
        # --otlp-endpoint: a span per decision (telemetry/tracing.py); without it, not even the SDK is imported.
        self.tracing: Tracing | None = None
        if s.otlp_endpoint:
            from loadaware.telemetry.tracing import Tracing
            self.tracing = Tracing(s.otlp_endpoint, s.trace_sample_ratio, self.metrics.registry)
            self.lifecycle.subscribe(self.tracing)
            self.extproc.tracer = self.tracing

    def _build_api(self, s: Settings) -> None:
        """The debug API, /debug and /metrics, all reading the running sidecar through one view (api/view.py)."""
        # The ext_proc port serves ext_proc and health only; the debug API and /debug are on the admin
        # listeners (loopback by default), /metrics alone on the metrics port (api/admin.py says why).
        self.view = SidecarView(
            FleetView(self.registry, self.catalog, self.loads, self.endpoint_health, self.signals, self.models),
            PrefixView(self.prefixes, self.bridge, self.decider.working_set, self.decider.queued),
            DecisionView(self.decider, s.effective_policy, s.loadaware_beta, self.tokenizer, self.admission),
            ProcessView(self.readiness, self.supervisor.state, self.extproc, s.describe))
        self.api = RouterServicer(self.view)
        self.metrics_page = MetricsPage(self.view, self.metrics)
        self.state_page = StatePage(self.view)
        self.metrics_http = MetricsHttp(self.metrics_page.render)
        self.debug_http = DebugHttp(self.recent.last, self.state_page.render)

    # ---- wiring helpers ----
    def _admission(self, s: Settings) -> AdmissionController | None:
        """--admission: the controller that holds requests while every eligible engine is saturated, hearing of
        each request's end and each engine's scrape (room appears then)."""
        if not s.admission:
            return None
        try:
            objectives = Objectives(load_objectives(s.objectives) if s.objectives else None)
        except (OSError, ObjectivesError) as exc:
            raise ValueError(f"--objectives: {exc}") from None
        health = self.endpoint_health
        room = PoolRoom(self.loads, self.registry.snapshot, health.not_admitted, s.saturation_queue)
        controller = AdmissionController(AdmissionSettings(s.saturation_queue, s.reserved_slots, s.admission_max_held,
                                                           s.admission_max_held_bytes, s.admission_ttl_s,
                                                           s.late_reserved_slots),
                                         objectives, room, self.metrics)
        self.lifecycle.subscribe(controller)
        self.loads.subscribe_scrapes(controller.on_scrape)
        self.metrics.flow_saturation.set_function(room.saturation)
        self.metrics.flow_top_wait_floor.set_function(controller.top_wait_floor)
        return controller

    def _discovery(self, s: Settings) -> tuple[DiscoveryCatalog, list[tuple[str, Task]]]:
        """--discovery's backend and its companions (fleet/discovery/registry.py): static and file feed the
        registry directly, the rest report through a catalog, which also keeps what ListEndpoints shows (health,
        pod, zone)."""
        catalog = DiscoveryCatalog(s.discovery_mode, self.registry, on_instance_ids=self._discovered_instance_ids)
        context = DiscoveryContext(self.registry, catalog, DiscoveryMetrics(self.metrics.registry),
                                   self.admission.objectives.set_cluster if self.admission is not None else None)
        return catalog, discovery_tasks(s.discovery_mode, s, context)

    def _discovered_instance_ids(self, discovered: Mapping[str, str]) -> None:
        # A pod name is the instance id LMCache registers under by default, so it needs no ip guessing; an
        # explicit --lmcache-instance-map entry still wins.
        self.bridge.explicit = {**discovered, **self.settings.lmcache_instance_map}
        self.bridge.set_endpoints(self.registry.snapshot())  # rebuild the live map now, not on the next poll

    # ---- fleet changes ----
    def _health_changed(self, endpoint: str, state: str, reason: str) -> None:
        log.warning("endpoint %s is now %s%s", endpoint, state, f" ({reason})" if reason else "")
        self.metrics.routing_state_changed(endpoint, state, reason)

    def _endpoint_removed(self, endpoint: str) -> None:
        """What the decision core does not keep forgets the endpoint too (the core forgets its own parts:
        routing/builder.py, `forget`)."""
        self.prefixes.endpoint_removed(endpoint)
        self.metrics.forget_endpoint(endpoint)

    def _endpoints_changed(self, endpoints: tuple[str, ...]) -> None:
        self.bridge.set_endpoints(endpoints)
        self.prefixes.endpoints_changed(endpoints)  # LMCache's instance map asks for a full refresh


class Sidecar(Wiring):
    """The process: start the servers and the background tasks; on SIGTERM report NOT_SERVING, drain, stop."""

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
        self.server: grpc.aio.Server | None = None
        self.health_server: grpc.aio.Server | None = None
        self.admin_server: grpc.aio.Server | None = None
        self.bound_port: int | None = None
        self.admin_port: int | None = None

    async def start(self) -> None:
        s = self.settings
        self.server = grpc.aio.server(options=[("grpc.so_reuseport", 0),
                                               ("grpc.max_receive_message_length", GRPC_MAX_MESSAGE_BYTES)])
        self.server.add_generic_rpc_handlers((self.extproc.handler(),))
        self.health.add_to(self.server)
        server = self.server
        self.bound_port = bind("--listen", s.listen, lambda: add_listener(server, s.listen, s.tls_cert, s.tls_key,
                                                                          s.tls_client_ca))
        await self.health.start()
        await self.server.start()
        if s.health_listen:
            health_server = self.health_server = grpc.aio.server()
            self.health.add_to(health_server)
            bind("--health-listen", s.health_listen, lambda: int(health_server.add_insecure_port(s.health_listen)))
            await health_server.start()
        if s.metrics_listen:
            await self.metrics_http.start(s.metrics_listen)
        await self._start_admin(s)
        tasks: list[tuple[str, Task]] = [("scraper", self.scraper.run)]
        if self.models_poller is not None:
            tasks.append(("models", self.models_poller.run))
        tasks += self._discovery_tasks  # the endpoints file's first among them
        tasks += self.prefixes.tasks()  # LMCache's instance map first among them
        tasks += [("readiness", self.health.run)]
        if self.tracing is not None:
            tasks.append(("traces", self.tracing.run))
        if self.memory_snapshots is not None:
            tasks.append(("memory-snapshots", self.memory_snapshots.run))
        if self.full_collections is not None:
            tasks.append(("gc-full", self.full_collections.run))
        self.supervisor.start([TaskSpec(name, run, required=is_required(name)) for name, run in tasks])
        log.info("serving ext_proc on %s (port %s), debug API on %s, policy=%s (%s) beta=%s endpoints=%s lmcache=%s "
                 "tokenizer=%s prefix-source=%s (%s)", s.listen, self.bound_port, s.admin_listen or "off",
                 s.effective_policy, s.policy_reason, s.loadaware_beta, ",".join(self.registry.snapshot()) or "none",
                 s.lmcache_url or "off", s.tokenizer or "off", ",".join(s.prefix_sources), s.prefix_reason)

    async def _start_admin(self, s: Settings) -> None:
        """The debug API, reflection and health on --admin-listen; /debug/* on --admin-http-listen."""
        for flag, address in (("--admin-listen", s.admin_listen), ("--admin-http-listen", s.admin_http_listen)):
            if address and not is_loopback(address):
                log.warning("%s %s is not a loopback address: whoever reaches it can ask whether a prompt was "
                            "recently served (keep it on 127.0.0.1 and use kubectl port-forward)", flag, address)
        if s.admin_listen:
            server = self.admin_server = admin_server(self.api, self.health.add_to)
            self.admin_port = bind("--admin-listen", s.admin_listen, lambda: int(server.add_insecure_port(
                s.admin_listen)), hint=" ('off' disables it)")
            await server.start()
        if s.admin_http_listen:
            try:
                await self.debug_http.start(s.admin_http_listen)
            except OSError as exc:
                raise OSError(f"--admin-http-listen: cannot bind {s.admin_http_listen} ('off' disables it): "
                              f"{exc.strerror or exc}") from exc

    async def stop(self) -> None:
        """Stop taking streams, let open ones finish within the grace, release every count."""
        await self.health.draining()
        grace = self.settings.shutdown_grace_s
        if self.server is not None:
            log.info("draining %d open streams (grace %.1fs)", self.extproc.open_streams, grace)
            await self.server.stop(grace)
        if self.health_server is not None:
            await self.health_server.stop(0)
        if self.admin_server is not None:
            await self.admin_server.stop(0)
        await self.supervisor.stop()
        if self.tracing is not None:
            await self.tracing.close()  # the spans of the streams just drained
        await self.metrics_http.stop()
        await self.debug_http.stop()
        await self.prefixes.close()  # LMCache's client among them
        await self.state_probe.close()
        if self.tokenizer is not None:
            self.tokenizer.close()
        leaked = self.loads.total()
        self.loads.clear()
        log.info("stopped; released %d in-flight counts", leaked)

    async def run_until_signalled(self) -> None:
        await self.start()
        loop = asyncio.get_running_loop()
        done = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, done.set)
        await done.wait()
        log.info("signal received: shutting down")
        await self.stop()
