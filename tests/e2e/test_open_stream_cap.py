"""End to end: engines that stop answering cannot pile requests into the sidecar past --max-open-streams.

Both engines hang (they accept and answer nothing); the requests already routed stay in flight, and the next
one gets a 503 with Retry-After at once, through the real Envoy in both deployments, instead of joining the pile
for the route's time-out. Healed, the held requests are answered and new ones are routed again.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from testkit.http import post_json, request
from tests.conftest import wait_until
from tests.e2e.both_deployments import DEPLOYMENTS, BothDeployments, both_deployments

pytestmark = pytest.mark.e2e

CAP = 2


class Stack(BothDeployments):
    def open_streams(self) -> int:
        status, body = request("GET", f"{self.sidecar.debug_url}/debug/state")
        assert status == 200
        return int(json.loads(body)["open_streams"])

    def fault(self, mode: str) -> None:
        for endpoint in self.fleet.endpoints:
            post_json(f"http://{endpoint}/sim/fault", {"mode": mode})


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with both_deployments(tmp_path_factory.mktemp("e2e-cap"), ["--max-open-streams", str(CAP)]) as both:
        yield Stack(both.fleet, both.sidecar, both.envoys)


def complete(url: str, prompt: str, timeout: float = 60.0) -> tuple[int, dict[str, Any], dict[str, str]]:
    """POST /v1/completions: (status, JSON body, headers)."""
    req = urllib.request.Request(url + "/v1/completions", method="POST", headers={"Content-Type": "application/json"},
                                 data=json.dumps({"model": "tiny-model", "prompt": prompt, "max_tokens": 2}).encode())
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read()), dict(resp.headers)
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"{}"), dict(err.headers)


@pytest.mark.parametrize("deployment", DEPLOYMENTS)
def test_hung_engines_fill_the_cap_and_the_next_request_gets_503_at_once(stack: Stack, deployment: str) -> None:
    url = stack.url(deployment)
    held: list[int] = []
    stack.fault("hang")
    try:
        threads = [threading.Thread(target=lambda i=i: held.append(complete(url, f"held {i}")[0]))
                   for i in range(CAP)]
        for t in threads:
            t.start()
        wait_until(lambda: stack.open_streams() == CAP, message="the held requests' streams open")
        started = time.monotonic()
        status, body, head = complete(url, "one too many", timeout=10)
        refused_in = time.monotonic() - started
        assert status == 503, body
        assert head.get("retry-after") == "1", head
        assert "too many requests in flight" in body["error"]["message"], body
        assert refused_in < 5, refused_in  # at once, not after a time-out (a wide bound: shared machines)
        # the refused stream closes (Envoy ends it after its local reply); the held ones stay, untouched
        wait_until(lambda: stack.open_streams() == CAP, message="the refused stream closed, the held ones open")
    finally:
        stack.fault("none")
    for t in threads:
        t.join(30)
    assert held == [200] * CAP  # healed: the held requests are answered
    wait_until(lambda: stack.open_streams() == 0, message="every stream closed")
    assert complete(url, "after the heal")[0] == 200
