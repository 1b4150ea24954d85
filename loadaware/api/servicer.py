"""loadaware.v1.Router on the sidecar's gRPC server: Explain, ListEndpoints, GetConfig.

Read-only: Explain runs the real decision pipeline with count=False (nothing is announced on the request
lifecycle: no in-flight count, no decision metric, no routing feedback to prefix indexes) on a copy of the
policy, so even round robin's turn is not used up by looking at it.
"""

from __future__ import annotations

import copy
import time
import uuid
from collections.abc import Callable
from typing import Any

import grpc

from loadaware.admission.controller import AdmissionController
from loadaware.api import explain
from loadaware.api.v1 import loadaware_pb2 as pb
from loadaware.api.v1 import loadaware_pb2_grpc as pb_grpc
from loadaware.fleet.discovery.catalog import DiscoveryCatalog
from loadaware.fleet.health import EndpointHealth
from loadaware.fleet.models import EndpointModels
from loadaware.fleet.registry import EndpointRegistry
from loadaware.load.signals import SignalTracker
from loadaware.load.tracker import LoadTracker
from loadaware.prefix.lmcache.bridge import InstanceBridge
from loadaware.routing.pipeline import Decider
from loadaware.routing.request import STATE_KIND, BadRequest, inference_kind, parse_body, state_request

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Router"].full_name
DEFAULT_PATH = "/v1/completions"


class RouterServicer(pb_grpc.RouterServicer):
    def __init__(self, policy: str, beta: float, describe: Callable[[], list[dict[str, Any]]], decider: Decider,
                 registry: EndpointRegistry, loads: LoadTracker, bridge: InstanceBridge, catalog: DiscoveryCatalog,
                 ready: Callable[[], bool], health: EndpointHealth | None = None,
                 models: EndpointModels | None = None, signals: SignalTracker | None = None,
                 admission: AdmissionController | None = None) -> None:
        self.signals = signals
        self.admission = admission
        self.policy = policy
        self.beta = beta
        self.describe = describe  # every setting with its origin (flag, env, default)
        self.decider = decider
        self.registry = registry
        self.loads = loads
        self.bridge = bridge
        self.catalog = catalog
        self.ready = ready
        self.health = health or EndpointHealth()
        self.models = models  # None: model awareness off

    def _models_for(self, endpoint: str) -> list[str]:
        known = self.models.models_of(endpoint) if self.models is not None else None
        return [] if known is None else known.names()

    def add_to(self, server: grpc.aio.Server) -> None:
        pb_grpc.add_RouterServicer_to_server(self, server)

    def _stats(self) -> Callable[[str], pb.ScrapedLoad | None]:
        now = self.loads.clock()
        stale_s = self.loads.stale_s
        return lambda ep: explain.scraped(self.loads.stats(ep), now, stale_s)

    async def Explain(self, request: pb.ExplainRequest, context: grpc.aio.ServicerContext) -> pb.ExplainResponse:
        path = request.path or DEFAULT_PATH
        kind = inference_kind("POST", path)
        if kind is None:
            return pb.ExplainResponse(outcome="passthrough", reasons=["not_an_inference_path"], policy=self.policy)
        t = time.perf_counter()
        try:
            state = state_request("POST", path) if kind == STATE_KIND else None
            parsed = state if state is not None else parse_body(kind, explain.body_bytes(request))
        except BadRequest as exc:
            return pb.ExplainResponse(outcome="rejected", reasons=[exc.reason], message=exc.message,
                                      policy=self.policy, kind=kind)
        decider = copy.copy(self.decider)  # shares every source; only the policy's own state is copied
        decider.policy = copy.copy(self.decider.policy)
        decision = await decider.decide(parsed, f"explain-{uuid.uuid4().hex[:12]}", count=False,
                                        parse_s=time.perf_counter() - t)
        excluded = self._excluded(decider, parsed.model, decision.pool_size) if decision.candidates else []
        out = explain.explanation(decision, decider.policy, self.beta, kind, self.bridge.instance_for,
                                  self.loads.count, self._stats(), self.health.state, excluded, parsed.model,
                                  self._models_for, self._observed_ttft)
        if self.admission is not None:
            out.admission.CopyFrom(pb.AdmissionView(enabled=True, **self.admission.preview(request.objective)))
        return out

    @staticmethod
    def _excluded(decider: Decider, model: str | None, chosen_among: int) -> list[str]:
        """The model's pool less what the decision chose among: the engines failing their requests. The
        candidates alone cannot say (a large pool's decision scores only those that could rank)."""
        pool = decider.endpoints(None, model)
        if chosen_among >= len(pool):
            return []
        eligible = set(decider.candidates(None, model, []))
        return [ep for ep in pool if ep not in eligible]

    async def ListEndpoints(self, request: pb.ListEndpointsRequest,
                            context: grpc.aio.ServicerContext) -> pb.ListEndpointsResponse:
        routable = self.registry.snapshot()
        loads = self.loads.loads(routable) if routable else []
        endpoints = explain.endpoint_list(self.catalog.entries(), self.catalog.source, routable, loads,
                                          self.bridge.instance_for, self.loads.count, self._stats(),
                                          self.health.view, self._models_for, self._signals_for)
        return pb.ListEndpointsResponse(endpoints=endpoints, discovery=self.catalog.source, ready=self.ready(),
                                        fleet_version=self.registry.version)

    def _observed_ttft(self, endpoint: str) -> float | None:
        sig = self.signals.get(endpoint) if self.signals is not None else None
        return sig.ttft_s if sig is not None else None

    def _signals_for(self, endpoint: str) -> pb.TokenSignals | None:
        """The endpoint's token signals as the next decision would see them."""
        if self.signals is None:
            return None
        return explain.token_signals(self.decider.signalled(endpoint, 0, 0.0), self._observed_ttft(endpoint))

    async def GetConfig(self, request: pb.GetConfigRequest, context: grpc.aio.ServicerContext) -> pb.GetConfigResponse:
        return pb.GetConfigResponse(settings=explain.settings_list(self.describe()))
