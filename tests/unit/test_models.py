"""Model pools: parsing vLLM's /v1/models, the per-endpoint store (fail open, staleness), the pipeline
narrowing candidates to the request's model (loads compared within the pool), and the gateway's 404."""

from __future__ import annotations

import json
from typing import Any

import pytest

from bench.extproc_inprocess import buffered_messages, duplex_messages
from loadaware.app import Sidecar
from loadaware.config import from_args
from loadaware.fleet.models import EndpointModels, ServedModels, parse_models
from loadaware.routing.request import InferenceRequest
from sim.models import parse_fleet_models
from tests.unit.test_extproc_duplex import Recorder
from tests.unit.test_pipeline import Rig as PipelineRig

A1, A2, B = "127.0.0.2:8000", "127.0.0.3:8000", "127.0.0.4:8000"
FLEET = (A1, A2, B)

# vLLM's answer for `--served-model-name model-b b-chat --lora-modules b-sql=/loras/sql`
VLLM_B = {"object": "list", "data": [
    {"id": "model-b", "object": "model", "root": "/models/b", "parent": None, "max_model_len": 4096},
    {"id": "b-chat", "object": "model", "root": "/models/b", "parent": None, "max_model_len": 4096},
    {"id": "b-sql", "object": "model", "root": "/loras/sql", "parent": "model-b"},
]}
MODELS_A = ServedModels(frozenset({"model-a"}))


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_parse_lists_every_served_name_and_adapter_with_its_parent() -> None:
    models = parse_models(VLLM_B)
    assert models.ids == {"model-b", "b-chat", "b-sql"}
    assert dict(models.parents) == {"b-sql": "model-b"}
    assert models.names() == ["b-chat", "b-sql", "model-b"]


def test_parse_skips_entries_without_an_id_and_refuses_a_non_list() -> None:
    assert parse_models({"data": [{"id": "x"}, {"object": "model"}, "junk", {"id": ""}]}).ids == {"x"}
    bad: Any
    for bad in ({}, [], {"data": {"id": "x"}}, "text"):
        with pytest.raises(ValueError):
            parse_models(bad)


def test_pool_filters_known_endpoints_and_keeps_unknown_ones() -> None:
    store = EndpointModels(stale_s=30, clock=Clock())
    assert store.pool("model-a", FLEET) is None  # nothing known: no filtering at all
    store.record(A1, MODELS_A)
    store.record(B, parse_models(VLLM_B))
    # A2 was never fetched: it may serve anything (fail open)
    assert store.pool("model-a", FLEET) == (A1, A2)
    assert store.pool("b-sql", FLEET) == (A2, B)
    store.record(A2, MODELS_A)
    assert store.pool("b-sql", FLEET) == (B,) and store.pool("model-a", FLEET) == (A1, A2)
    assert store.pool("nope", FLEET) == ()
    assert store.served_anywhere("b-chat") and not store.served_anywhere("nope")


def test_a_stale_list_counts_as_unknown_and_a_removed_endpoint_is_forgotten() -> None:
    clock = Clock()
    store = EndpointModels(stale_s=30, clock=clock)
    store.record(A1, MODELS_A)
    store.record(B, parse_models(VLLM_B))
    clock.now += 20
    store.record(B, parse_models(VLLM_B))  # B refreshed; A1's fetches keep failing
    assert store.pool("model-b", (A1, B)) == (B,)
    clock.now += 11  # A1's last good list is now 31 s old
    assert store.models_of(A1) is None and store.pool("model-b", (A1, B)) == (A1, B)
    store.forget(B)
    assert store.pool("model-b", (A1, B)) is None
    assert store.state((A1, B)) == {A1: None, B: None}


# ---- the pipeline ----

class Rig(PipelineRig):
    """The pipeline's rig with a model store: A1 and A2 serve model-a, B serves model-b and its adapters."""

    def __init__(self, policy: str = "loadaware") -> None:
        self.store = EndpointModels(stale_s=30)
        super().__init__(policy, None, False, FLEET, fallbacks=2, models=self.store)
        self.store.record(A1, MODELS_A)
        self.store.record(A2, MODELS_A)
        self.store.record(B, parse_models(VLLM_B))


def request(model: str | None) -> InferenceRequest:
    return InferenceRequest("completions", prompt="hello there", model=model)


async def test_candidates_are_the_models_pool_and_the_mean_is_taken_within_it() -> None:
    rig = Rig()
    for endpoint, n in ((A2, 2), (B, 10)):
        for _ in range(n):
            rig.loads.acquire(endpoint)
    decision = await rig.decider.decide(request("model-a"), "r1")
    assert [c.endpoint for c in decision.candidates] == [A1, A2] and decision.endpoint == A1
    # Within model-a's pool the mean load is 1: relative loads -1 and +1, scores +1 and -1 (no prefix credit).
    # Had B's 10 counted, the mean would be 4 and A2 would score +0.5.
    assert decision.scores == (1.0, -1.0)
    assert decision.ranked == (A1, A2)  # B is never even a fallback for model-a
    for model in ("model-b", "b-chat", "b-sql"):
        d = await rig.decider.decide(request(model), model)
        assert d.endpoint == B and d.ranked == (B,) and d.outcome != "unknown_model"


async def test_no_model_in_the_body_or_no_lists_known_means_no_filtering() -> None:
    rig = Rig()
    decision = await rig.decider.decide(request(None), "r1")
    assert {c.endpoint for c in decision.candidates} == set(FLEET)
    for ep in FLEET:
        rig.store.forget(ep)
    decision = await rig.decider.decide(request("anything"), "r2")
    assert {c.endpoint for c in decision.candidates} == set(FLEET) and decision.outcome != "unknown_model"


async def test_a_model_no_engine_serves_is_unknown_model_and_takes_no_count() -> None:
    rig = Rig()
    decision = await rig.decider.decide(request("gpt-nope"), "r1")
    assert decision.outcome == "unknown_model" and decision.reasons == ("unknown_model",)
    assert decision.endpoint is None and decision.ranked == () and decision.lease is None
    assert rig.loads.total() == 0
    assert rig.metrics.decisions.value("loadaware", "none", "unknown_model") == 1
    # Served in the fleet but not in the proxy's subset: that is the subset's doing, not an unknown model.
    d = await rig.decider.decide(request("model-b"), "r2", subset=frozenset({A1, A2}))
    assert d.outcome == "no_eligible_endpoints"


# ---- the reply, in both ext_proc modes ----


def sidecar() -> Sidecar:
    app = Sidecar(from_args(["--endpoints", ",".join(FLEET), "--metrics-listen", "off", "--policy", "leastload"],
                            environ={}))
    assert app.models is not None
    for ep, models in ((A1, MODELS_A), (A2, MODELS_A), (B, parse_models(VLLM_B))):
        app.models.record(ep, models)
    return app


def body(model: str) -> bytes:
    return json.dumps({"model": model, "prompt": "hello", "max_tokens": 4}).encode()


async def converse(app: Sidecar, messages: list[Any]) -> list[Any]:
    feed = Recorder(messages)
    await app.extproc.process(None, feed)
    return feed.sent


async def test_picker_answers_an_unknown_model_with_vllms_404_json() -> None:
    app = sidecar()
    (reply,) = await converse(app, duplex_messages(body("gpt-nope"), chunks=0))
    immediate = reply.immediate_response
    assert immediate.status.code == 404
    assert {h.header.key: h.header.raw_value for h in immediate.headers.set_headers} == {
        "content-type": b"application/json"}
    assert json.loads(immediate.body) == {"error": {"message": "The model `gpt-nope` does not exist.",
                                                    "type": "NotFoundError", "param": "model", "code": 404}}
    assert app.loads.total() == 0 and app.recent.items[-1].outcome == "unknown_model"
    sent = await converse(app, duplex_messages(body("b-sql"), chunks=0))
    header = {h.header.key: h.header.raw_value.decode()
              for h in sent[0].request_headers.response.header_mutation.set_headers}
    assert header["x-gateway-destination-endpoint"] == B


async def test_buffered_sidecar_answers_an_unknown_model_404_whatever_the_no_endpoint_setting() -> None:
    app = sidecar()  # --no-endpoint-reply auto: BUFFERED passes an empty fleet on, but not an unknown model
    sent = await converse(app, buffered_messages(body("gpt-nope")))
    immediate = sent[-1].immediate_response
    assert immediate.status.code == 404 and immediate.details == "loadaware_unknown_model"
    # plain text: envoy/envoy.yaml's local_reply_config wraps it into the OpenAI JSON for a 404
    assert immediate.body == b"The model `gpt-nope` does not exist."
    sent = await converse(app, buffered_messages(body("model-a")))
    header = {h.header.key: h.header.raw_value.decode()
              for h in sent[-1].request_body.response.header_mutation.set_headers}
    assert set(header["x-gateway-destination-endpoint"].split(",")) == {A1, A2}


def test_models_off_with_zero_refresh() -> None:
    app = Sidecar(from_args(["--endpoints", A1, "--metrics-listen", "off", "--models-refresh-s", "0"], environ={}))
    assert app.models is None and app.models_poller is None and app.decider.filters.models is None


# ---- the simulator's model specs ----

def test_sim_model_specs_give_each_engine_its_names_and_adapters() -> None:
    a, a2, b = parse_fleet_models("model-a;model-a;model-b,b-chat+b-sql=/loras/sql+b-x", 3)
    assert a == a2 and a.servable() == {"model-a"}
    assert b.base == "model-b" and b.servable() == {"model-b", "b-chat", "b-sql", "b-x"}
    listing = parse_models(b.listing(4096))  # what the sidecar reads back from the engine's /v1/models
    assert listing.ids == b.servable() and dict(listing.parents) == {"b-sql": "model-b", "b-x": "model-b"}
    assert parse_fleet_models("m", 2)[1].servable() == {"m"}
    with pytest.raises(ValueError):
        parse_fleet_models("a;b", 3)
