"""loadaware.v1.Router on the sidecar's gRPC server: Explain, ListEndpoints, GetConfig, each read through the
running sidecar's view (api/view.py).

Read-only: Explain runs the real decision pipeline with count=False (nothing is announced on the request
lifecycle: no in-flight count, no decision metric, no routing feedback to prefix indexes) on a copy of the
policy, so even round robin's turn is not used up by looking at it.
"""

from __future__ import annotations

import copy
import time
import uuid
from collections.abc import Callable

import grpc

from loadaware.api import explain
from loadaware.api.v1 import loadaware_pb2 as pb
from loadaware.api.v1 import loadaware_pb2_grpc as pb_grpc
from loadaware.api.view import SidecarView
from loadaware.routing.pipeline import Decider
from loadaware.routing.request import STATE_KIND, BadRequest, inference_kind, parse_body, state_request

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Router"].full_name
DEFAULT_PATH = "/v1/completions"


class RouterServicer(pb_grpc.RouterServicer):
    def __init__(self, view: SidecarView) -> None:
        self.fleet = view.fleet
        self.routing = view.decision
        self.process = view.process
        self.bridge = view.prefix.bridge

    def _models_for(self, endpoint: str) -> list[str]:
        known = self.fleet.models.models_of(endpoint) if self.fleet.models is not None else None
        return [] if known is None else known.names()

    def add_to(self, server: grpc.aio.Server) -> None:
        pb_grpc.add_RouterServicer_to_server(self, server)

    def _stats(self) -> Callable[[str], pb.ScrapedLoad | None]:
        loads = self.fleet.loads
        now = loads.clock()
        stale_s = loads.stale_s
        return lambda ep: explain.scraped(loads.stats(ep), now, stale_s)

    async def Explain(self, request: pb.ExplainRequest, context: grpc.aio.ServicerContext) -> pb.ExplainResponse:
        path = request.path or DEFAULT_PATH
        kind = inference_kind("POST", path)
        if kind is None:
            return pb.ExplainResponse(outcome="passthrough", reasons=["not_an_inference_path"],
                                      policy=self.routing.policy)
        t = time.perf_counter()
        try:
            state = state_request("POST", path) if kind == STATE_KIND else None
            parsed = state if state is not None else parse_body(kind, explain.body_bytes(request))
        except BadRequest as exc:
            return pb.ExplainResponse(outcome="rejected", reasons=[exc.reason], message=exc.message,
                                      policy=self.routing.policy, kind=kind)
        live = self.routing.decider
        decider = live.with_policy(copy.copy(live.policy))  # shares every source; only the policy's state is copied
        decision = await decider.decide(parsed, f"explain-{uuid.uuid4().hex[:12]}", count=False,
                                        parse_s=time.perf_counter() - t)
        excluded = self._excluded(decider, parsed.model, decision.pool_size) if decision.candidates else []
        out = explain.explanation(decision, decider.policy, self.routing.beta, kind, self.bridge.instance_for,
                                  self.fleet.loads.count, self._stats(), self.fleet.health.state, excluded,
                                  parsed.model, self._models_for, self._observed_ttft)
        admission = self.routing.admission
        if admission is not None:
            out.admission.CopyFrom(pb.AdmissionView(enabled=True, **admission.preview(request.objective)))
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
        fleet = self.fleet
        routable = fleet.registry.snapshot()
        loads = fleet.loads.loads(routable) if routable else []
        endpoints = explain.endpoint_list(fleet.catalog.entries(), fleet.catalog.source, routable, loads,
                                          self.bridge.instance_for, fleet.loads.count, self._stats(),
                                          fleet.health.view, self._models_for, self._signals_for)
        return pb.ListEndpointsResponse(endpoints=endpoints, discovery=fleet.catalog.source,
                                        ready=self.process.readiness.ready(), fleet_version=fleet.registry.version)

    def _observed_ttft(self, endpoint: str) -> float | None:
        signals = self.fleet.signals
        sig = signals.get(endpoint) if signals is not None else None
        return sig.ttft_s if sig is not None else None

    def _signals_for(self, endpoint: str) -> pb.TokenSignals | None:
        """The endpoint's token signals as the next decision would see them."""
        if self.fleet.signals is None:
            return None
        return explain.token_signals(self.routing.decider.signalled(endpoint, 0, 0.0),
                                     self._observed_ttft(endpoint))

    async def GetConfig(self, request: pb.GetConfigRequest, context: grpc.aio.ServicerContext) -> pb.GetConfigResponse:
        return pb.GetConfigResponse(settings=explain.settings_list(self.process.settings()))
