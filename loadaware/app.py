"""Wiring and lifecycle: build the sources, the decider and the servers; drain on SIGTERM."""

from __future__ import annotations

import asyncio
import json
import logging
import signal
from typing import Any

import grpc
from aiohttp import web
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from loadaware.api.servicer import SERVICE_NAME as API_SERVICE_NAME
from loadaware.api.servicer import RouterServicer
from loadaware.config import Settings
from loadaware.routing.pipeline import Decider
from loadaware.policies import make_policy
from loadaware.extproc.stream import SERVICE_NAME, ExtProcServicer
from loadaware.fleet.discovery.wiring import Discovery
from loadaware.fleet.registry import EndpointRegistry, EndpointsFileWatcher
from loadaware.load.inflight import InflightTracker
from loadaware.prefix.lmcache.bridge import InstanceBridge
from loadaware.prefix.lmcache.client import InstanceResolver, LMCacheClient, LMCachePrefixSource
from loadaware.load.view import LoadView
from loadaware.prefix.combined import PrefixWiring
from loadaware.load.scraper import MetricsScraper
from loadaware.tokenize.tokenizer import AsyncTokenizer, PromptTokenizer
from loadaware.telemetry.metrics import Metrics

log = logging.getLogger(__name__)

# A health service name that is SERVING for as long as the process serves: the liveness probe's. Readiness
# ("") is NOT_SERVING with an empty fleet, which must not get the pod restarted.
LIVENESS_SERVICE = "liveness"


class Sidecar:
    def __init__(self, settings: Settings) -> None:
        self.settings = s = settings
        self.metrics = Metrics(s.policy)
        self.inflight = InflightTracker()
        self.registry = EndpointRegistry(s.endpoints)
        self.loads = LoadView(self.inflight, stale_s=s.scrape_stale_s)
        self.bridge = InstanceBridge(s.lmcache_instance_map)
        self.bridge.set_endpoints(self.registry.snapshot())
        self.tokenizer = AsyncTokenizer(PromptTokenizer(s.tokenizer), s.tokenizer_timeout_ms / 1e3) \
            if s.tokenizer else None
        self.lmcache = LMCacheClient(s.lmcache_url, s.lmcache_timeout_ms / 1e3) if s.lmcache_url else None
        self.resolver = InstanceResolver(self.lmcache, self.bridge, s.instance_refresh_s) if self.lmcache else None
        lmcache_source = LMCachePrefixSource(self.lmcache, self.bridge, self.resolver, self.metrics) \
            if self.lmcache else None
        # --prefix-source: LMCache, the KV-events index, the approximate index, or a combination.
        self.prefixes = PrefixWiring(s, self.metrics, self.registry.snapshot, lmcache_source,
                                     lambda eps: {ep for ep in eps if self.bridge.instance_for(ep)})
        self.prefix_source = self.prefixes.source
        tokenizer = self.tokenizer or self.prefixes.text_units_tokenizer(self.tokenizer is not None)
        self.decider = Decider(make_policy(s.policy, s.loadaware_beta), self.registry, self.loads, self.inflight,
                               self.metrics, tokenizer, self.prefix_source,  # type: ignore[arg-type]
                               on_routed=self.prefixes.on_routed)
        self.scraper = MetricsScraper(self.registry, self.loads, self.metrics, s.scrape_interval_s,
                                      s.scrape_timeout_ms / 1e3)
        self.file_watcher = EndpointsFileWatcher(s.endpoints_file, self.registry) if s.endpoints_file else None
        if self.file_watcher:
            self.file_watcher.poll()  # the first set is in before the first stream
        self.registry.on_removed(self._endpoint_removed)
        self.registry.on_removed(lambda _ep: self._endpoints_changed())
        # --discovery envoy-admin | kubernetes report through a catalog into the same registry.
        self.discovery = Discovery(s, self.registry, self.bridge, self.metrics.registry)
        self.api = RouterServicer(s, self.decider, self.registry, self.loads, self.inflight, self.bridge,
                                  self.discovery.catalog, self.ready)
        # The scrape round that must finish before readiness (see _scraped_since_fleet).
        self._fleet_round: int | None = 1 if self.registry.snapshot() else None
        self.extproc = ExtProcServicer(self.decider, self.metrics, s.destination_header)
        self.health = health.aio.HealthServicer() if hasattr(health, "aio") else health.HealthServicer()
        self.server: grpc.aio.Server | None = None
        self.http_runner: web.AppRunner | None = None
        self.bound_port: int | None = None
        self._tasks: list[asyncio.Task[Any]] = []
        self._stopping = asyncio.Event()

    # ---- fleet changes ----
    def _endpoint_removed(self, endpoint: str) -> None:
        self.inflight.drop(endpoint)
        self.loads.drop(endpoint)
        self.prefixes.endpoint_removed(endpoint)
        self.metrics.forget_endpoint(endpoint)

    def _endpoints_changed(self) -> None:
        self.bridge.set_endpoints(self.registry.snapshot())
        if self.resolver:
            self.resolver.request_full()

    # ---- readiness ----
    def ready(self) -> bool:
        """Endpoints known, loads scraped once, and the LMCache instance map tried once (when configured)."""
        return (self.registry.ready and bool(self.registry.snapshot()) and self._scraped_since_fleet()
                and (self.resolver is None or self.resolver.attempts > 0))

    def _scraped_since_fleet(self) -> bool:
        """A scrape round over the fleet has finished. A fleet that discovery finds after start may arrive
        while a round over the empty set is running; that round must not count, so wait for the next."""
        if not self.registry.snapshot():
            return False
        if self._fleet_round is None:
            self._fleet_round = self.scraper.rounds + 2
        return self.scraper.rounds >= self._fleet_round

    async def _readiness_loop(self) -> None:
        status = None
        while True:
            want = health_pb2.HealthCheckResponse.SERVING if self.ready() and not self._stopping.is_set() \
                else health_pb2.HealthCheckResponse.NOT_SERVING
            if want != status:
                status = want
                for name in ("", SERVICE_NAME):
                    await self._set_health(name, want)
                log.info("health %s", health_pb2.HealthCheckResponse.ServingStatus.Name(want))
            await asyncio.sleep(0.2)

    async def _set_health(self, name: str, status: int) -> None:
        result = self.health.set(name, status)
        if asyncio.iscoroutine(result):
            await result

    # ---- lifecycle ----
    async def start(self) -> None:
        s = self.settings
        # Endpoint additions are seen by polling the registry version (removals notify at once).
        self.server = grpc.aio.server(options=[("grpc.so_reuseport", 0),
                                               ("grpc.max_receive_message_length", 64 * 1024 * 1024)])
        self.server.add_generic_rpc_handlers((self.extproc.handler(),))
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        self.api.add_to(self.server)
        reflection.enable_server_reflection(
            (SERVICE_NAME, API_SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME), self.server)
        self.bound_port = self.server.add_insecure_port(s.listen)
        if not self.bound_port:
            raise OSError(f"--listen: cannot bind {s.listen}")
        await self._set_health("", health_pb2.HealthCheckResponse.NOT_SERVING)
        await self._set_health(LIVENESS_SERVICE, health_pb2.HealthCheckResponse.SERVING)
        await self.server.start()
        if s.metrics_listen:
            await self._start_http(s.metrics_listen)
        self._tasks.append(asyncio.create_task(self.scraper.run(), name="scraper"))
        if self.file_watcher:
            self._tasks.append(asyncio.create_task(self.file_watcher.run(), name="endpoints-file"))
        for name, start in self.discovery.tasks():
            self._tasks.append(asyncio.create_task(start(), name=name))
        if self.resolver:
            self._tasks.append(asyncio.create_task(self.resolver.run(), name="lmcache-instances"))
        for name, run in self.prefixes.tasks():
            self._tasks.append(asyncio.create_task(run(), name=name))  # type: ignore[arg-type]
        self._tasks.append(asyncio.create_task(self._track_additions(), name="endpoint-additions"))
        self._tasks.append(asyncio.create_task(self._readiness_loop(), name="readiness"))
        log.info("serving ext_proc on %s (port %s), policy=%s beta=%s endpoints=%s lmcache=%s tokenizer=%s",
                 s.listen, self.bound_port, s.policy, s.loadaware_beta, ",".join(self.registry.snapshot()) or "none",
                 s.lmcache_url or "off", s.tokenizer or "off")

    async def _track_additions(self) -> None:
        version = self.registry.version
        while True:
            await asyncio.sleep(0.2)
            if self.registry.version != version:
                version = self.registry.version
                self._endpoints_changed()

    async def _start_http(self, listen: str) -> None:
        app = web.Application()
        app.router.add_get("/metrics", self._http_metrics)
        app.router.add_get("/debug/decisions", self._http_decisions)
        app.router.add_get("/debug/state", self._http_state)
        self.http_runner = web.AppRunner(app, access_log=None)
        await self.http_runner.setup()
        host, _, port = listen.rpartition(":")
        await web.TCPSite(self.http_runner, host.strip("[]"), int(port)).start()

    async def _http_metrics(self, _request: web.Request) -> web.Response:
        self.prefixes.refresh_gauges()
        if self.tokenizer is not None:
            pieces = self.tokenizer.tokenizer.pieces
            self.metrics.tokenizer_pieces_seen(pieces.hits, pieces.misses, pieces.enabled)
        body = self.metrics.render(self.inflight.snapshot, self.registry.snapshot())
        return web.Response(body=body, content_type="text/plain", charset="utf-8")

    async def _http_decisions(self, request: web.Request) -> web.Response:
        n = int(request.query.get("n", "50"))
        items = [d.as_dict() for d in list(self.decider.recent)[-n:]]
        return web.json_response(items, dumps=lambda o: json.dumps(o, indent=1))

    async def _http_state(self, _request: web.Request) -> web.Response:
        endpoints = self.registry.snapshot()
        loads = self.loads.loads(endpoints) if endpoints else []
        state = {
            "ready": self.ready(), "open_streams": self.extproc.open_streams,
            "inflight": self.inflight.snapshot(), "inflight_total": self.inflight.total(),
            "endpoints": [{"endpoint": ep, "load": load, "inflight": self.inflight.count(ep),
                           "instance_id": self.bridge.instance_for(ep),
                           "scraped": (lambda st: None if st is None else {
                               "running": st.running, "waiting": st.waiting, "kv_usage": st.kv_usage})(
                               self.loads.fresh_stats(ep))}
                          for ep, load in zip(endpoints, loads)],
            "instance_map": self.bridge.mapping(), "config": self.settings.describe(),
            "prefix": self.prefixes.state(),
        }
        return web.json_response(state)

    async def stop(self) -> None:
        """Stop taking streams, let open ones finish within the grace, release every count."""
        self._stopping.set()
        for name in ("", SERVICE_NAME):
            await self._set_health(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        grace = self.settings.shutdown_grace_s
        if self.server is not None:
            log.info("draining %d open streams (grace %.1fs)", self.extproc.open_streams, grace)
            await self.server.stop(grace)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.http_runner is not None:
            await self.http_runner.cleanup()
        if self.lmcache is not None:
            await self.lmcache.close()
        await self.prefixes.close()
        if self.tokenizer is not None:
            self.tokenizer.close()
        leaked = self.inflight.total()
        self.inflight.clear()
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
