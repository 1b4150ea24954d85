"""End to end: a request only its stored response's holder can serve is retried on the holder, never elsewhere.

The shipped routes retry a 5xx or a reset on the next host (envoy/envoy.yaml, envoy/envoy-inference-pool.yaml).
For a Responses follow-up, every other engine answers 404 (the response is not stored there): a holder's passing
fault would reach the client as "no such response". The sidecar lists the holder once per attempt instead
(extproc/replies.py, PINNED_REPEATS), so the client gets the holder's own answer. Real Envoy, both deployments,
two simulated engines that store responses per process as vLLM does.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from testkit.http import post_json, request
from tests.e2e.both_deployments import DEPLOYMENTS, BothDeployments, both_deployments

pytestmark = pytest.mark.e2e

ATTEMPTS = 3  # the shipped routes' num_retries (2) + 1


class Stack(BothDeployments):
    def endpoint_of(self, engine_name: str) -> str:
        return next(f"{e['ip']}:{e['port']}" for e in self.fleet.engines if e["name"] == engine_name)

    def ejected_by_envoy(self, deployment: str, endpoint: str) -> bool:
        """Envoy's own outlier detection has the engine out (its host's health flags in the admin API)."""
        return any(line.startswith(f"engines::{endpoint}::health_flags::") and "failed_outlier_check" in line
                   for line in self.envoys[deployment].admin_get("clusters").splitlines())


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with both_deployments(tmp_path_factory.mktemp("e2e-pinned")) as both:
        yield Stack(both.fleet, both.sidecar, both.envoys)


def respond(url: str, payload: dict[str, Any]) -> tuple[int, dict[str, Any], str]:
    """POST /v1/responses: (status, body, the engine that answered)."""
    req = urllib.request.Request(url + "/v1/responses", data=json.dumps(payload).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read()), resp.headers.get("x-served-by", "")
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"{}"), err.headers.get("x-served-by", "")


def failed(endpoint: str) -> int:
    status, body = request("GET", f"http://{endpoint}/sim/state")
    assert status == 200
    return int(json.loads(body)["failed"])


@pytest.mark.parametrize("deployment", DEPLOYMENTS)
def test_a_follow_up_whose_holder_fails_gets_the_holders_answer_not_another_engines_404(
        stack: Stack, deployment: str) -> None:
    url = stack.url(deployment)
    status, first, made_by = respond(url, {"model": "tiny-model", "input": f"conversation {uuid.uuid4().hex}",
                                           "store": True, "max_output_tokens": 4})
    assert status == 200, first
    holder = stack.endpoint_of(made_by)
    other = next(ep for ep in stack.fleet.endpoints if ep != holder)
    before = {ep: failed(ep) for ep in stack.fleet.endpoints}
    post_json(f"http://{holder}/sim/fault", {"mode": "error", "status": 503})
    try:
        status, body, served = respond(url, {"model": "tiny-model", "input": "the next turn",
                                             "previous_response_id": first["id"], "max_output_tokens": 4})
    finally:
        post_json(f"http://{holder}/sim/fault", {"mode": "none"})
    # Every attempt went to the holder; the other engine, which would have answered 404, saw none.
    assert (status, served) == (503, made_by), body
    assert failed(holder) - before[holder] == ATTEMPTS
    assert failed(other) == before[other]
    # Healed, the same follow-up is served by the holder, though Envoy's outlier detection (3 consecutive 5xx)
    # has just ejected it (for 1 s): override_host still takes an ejected host it is given.
    assert stack.ejected_by_envoy(deployment, holder)
    status, body, served = respond(url, {"model": "tiny-model", "input": "the next turn",
                                         "previous_response_id": first["id"], "max_output_tokens": 4})
    assert (status, served) == (200, made_by), body
    assert stack.ejected_by_envoy(deployment, holder)  # still out while that follow-up was served


def test_a_request_with_no_state_is_still_retried_on_the_next_engine(stack: Stack) -> None:
    """The pin is only for a stored response's holder: any other request keeps the route's retry elsewhere."""
    engines = list(stack.fleet.endpoints)
    post_json(f"http://{engines[0]}/sim/fault", {"mode": "error", "status": 503})
    try:
        statuses = [respond(stack.url("buffered"), {"model": "tiny-model", "input": f"q {i} {uuid.uuid4().hex}",
                                                         "max_output_tokens": 4})[0] for i in range(6)]
    finally:
        post_json(f"http://{engines[0]}/sim/fault", {"mode": "none"})
    assert statuses == [200] * 6

