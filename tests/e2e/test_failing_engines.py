"""Failure-aware routing through the real Envoy, the sidecar and 3 simulated engines under steady load.

An engine that fails fast (answers 500 within milliseconds, its server alive) looks idle to a load-aware
router and draws most of the traffic. These tests break one engine while an open-loop sender keeps a steady
rate, and measure what clients get, where the decisions go, and how fast a healed engine is back:

- fast 500s: from 2 s after the onset at least 99% of client requests succeed (Envoy retries a 5xx on the
  next engine of the ranked list) and the failing engine gets at most 5% of the decisions after the sidecar
  ejected it (its probes: one request at a time, each after a doubling backoff);
- a hung engine (accepts connections, never answers): its requests end in 504 after the route timeout, its
  scrapes time out and take it out of rotation;
- healed: within 10 s it takes its share again.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import ClientSession, ClientTimeout

from testkit.http import post_json
from testkit.metrics_text import sum_by_label
from testkit.openloop import OpenLoopSender, success_rate
from testkit.paths import ENVOY_CONFIG
from testkit.stack import Stack
from tests.conftest import wait_until_async

pytestmark = pytest.mark.e2e

RATE = 40.0  # requests per second, open loop
FLEET = ["--decode-base-ms", "2", "--decode-per-seq-ms", "0", "--prefill-overhead-ms", "0"]
SIDECAR = ["--log-level", "warning", "--scrape-interval-s", "0.5", "--scrape-timeout-ms", "400"]
ROUTE_TIMEOUT_S = 3.0  # the hang test's Envoy config: route timeout cut from 600 s


def completions_sender(session: ClientSession, url: str) -> OpenLoopSender:
    async def one(n: int) -> tuple[int, str]:
        body = {"model": "tiny-model", "prompt": f"request {n} about the weather in city {n % 17}", "max_tokens": 4}
        async with session.post(f"{url}/v1/completions", json=body) as resp:
            await resp.read()
            return resp.status, resp.headers.get("x-served-by", "")
    return OpenLoopSender(RATE, one)


def decisions_by_endpoint(stack: Stack) -> dict[str, float]:
    assert stack.sidecar is not None
    return sum_by_label(stack.sidecar.metrics_text(), "loadaware_decisions_total", "endpoint")


def routing_state(stack: Stack, endpoint: str) -> dict[str, Any]:
    assert stack.sidecar is not None
    state = stack.sidecar.debug_json("/debug/state")
    row = next(r for r in state["endpoints"] if r["endpoint"] == endpoint)
    return dict(row["routing_health"])


def set_fault(stack: Stack, endpoint: str, mode: str) -> None:
    post_json(f"http://{endpoint}/sim/fault", {"mode": mode, "status": 500})


def share(before: dict[str, float], after: dict[str, float], endpoint: str) -> tuple[float, float]:
    """(decisions to `endpoint`, all decisions) between two counter snapshots."""
    total = sum(after.get(k, 0) - before.get(k, 0) for k in after)
    return after.get(endpoint, 0) - before.get(endpoint, 0), total


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    with Stack(tmp_path, engines=3, lmcache=False, fleet_args=FLEET, sidecar_args=SIDECAR) as s:
        yield s


@pytest.fixture
def hang_stack(tmp_path: Path) -> Iterator[Stack]:
    config = ENVOY_CONFIG.read_text()
    short, n = re.subn(r"timeout: 600s", f"timeout: {ROUTE_TIMEOUT_S:g}s", config)
    assert n == 1, "the shipped engine route's timeout moved"
    path = tmp_path / "envoy-short-timeout.yaml"
    path.write_text(short)
    with Stack(tmp_path, engines=3, lmcache=False, fleet_args=FLEET, sidecar_args=SIDECAR,
               envoy_config=path) as s:
        yield s


@dataclass
class Figures:
    """What one scenario measured (times are monotonic)."""
    sender: OpenLoopSender
    victim: str
    onset: float = 0.0
    detected_after_s: float = 0.0
    state_while_failing: dict[str, Any] = field(default_factory=dict)
    victim_decisions: float = 0.0  # decisions to the broken engine from its ejection to its healing
    all_decisions: float = 0.0
    healed: float = 0.0
    back_after_s: float = 0.0  # healing -> healthy again
    back_decisions: float = 0.0  # decisions to it in the seconds after it was back
    back_total: float = 0.0

    def describe(self) -> str:
        return (f"detected after {self.detected_after_s:.2f} s; decisions to it while out: "
                f"{self.victim_decisions:.0f} of {self.all_decisions:.0f} "
                f"({self.victim_decisions / max(1, self.all_decisions):.1%}); healed -> healthy after "
                f"{self.back_after_s:.2f} s, then {self.back_decisions:.0f} of {self.back_total:.0f} decisions; "
                f"state while failing {self.state_while_failing}")

    def assert_avoided_then_back(self) -> None:
        """At most 5% of the decisions while it failed; back within 10 s of healing, taking its share (a third
        of the fleet; at least a sixth here)."""
        assert self.all_decisions > 100
        assert self.victim_decisions / self.all_decisions <= 0.05
        assert self.back_after_s <= 10.0
        assert self.back_total > 50 and self.back_decisions / self.back_total >= 1 / 6
        assert success_rate(self.sender.window(self.healed, self.healed + 4.0)) >= 0.99


async def run_scenario(stack: Stack, fault: str, fault_s: float, healed_s: float) -> Figures:
    """Steady load; the first engine breaks after a warm-up and heals `fault_s` later."""
    assert stack.fleet is not None
    stop = asyncio.Event()
    async with ClientSession(timeout=ClientTimeout(total=ROUTE_TIMEOUT_S + 30)) as session:
        f = Figures(completions_sender(session, stack.url), stack.fleet.endpoints[0])
        load = asyncio.create_task(f.sender.run(stop, drain_s=ROUTE_TIMEOUT_S + 5))
        await asyncio.sleep(3.0)
        await asyncio.to_thread(set_fault, stack, f.victim, fault)
        f.onset = time.monotonic()
        f.detected_after_s = await _wait_state(stack, f.victim, ("ejected", "probing"), timeout=15) - f.onset
        before = await asyncio.to_thread(decisions_by_endpoint, stack)
        f.state_while_failing = await asyncio.to_thread(routing_state, stack, f.victim)
        await asyncio.sleep(max(0.0, f.onset + fault_s - time.monotonic()))
        after = await asyncio.to_thread(decisions_by_endpoint, stack)
        f.victim_decisions, f.all_decisions = share(before, after, f.victim)
        await asyncio.to_thread(set_fault, stack, f.victim, "none")
        f.healed = time.monotonic()
        f.back_after_s = await _wait_state(stack, f.victim, ("healthy",), timeout=15) - f.healed
        before = await asyncio.to_thread(decisions_by_endpoint, stack)
        await asyncio.sleep(healed_s)
        after = await asyncio.to_thread(decisions_by_endpoint, stack)
        f.back_decisions, f.back_total = share(before, after, f.victim)
        stop.set()
        await load
    return f


async def _wait_state(stack: Stack, endpoint: str, states: tuple[str, ...], timeout: float) -> float:
    async def reached() -> bool:
        return (await asyncio.to_thread(routing_state, stack, endpoint))["state"] in states
    await wait_until_async(reached, message=f"{endpoint} never reached {states}", timeout=timeout, interval=0.05)
    return time.monotonic()


async def test_fast_failing_engine_is_ejected_and_clients_succeed(stack: Stack) -> None:
    f = await run_scenario(stack, "error", fault_s=10.0, healed_s=4.0)
    steady = f.sender.window(f.onset + 2.0, f.healed)
    rate = success_rate(steady)
    print(f"\nfast 500: clients from onset+2 s to heal: {rate:.2%} of {len(steady)} succeeded; {f.describe()}")
    assert rate >= 0.99, [(round(s.at - f.onset, 2), s.status) for s in steady if s.status != 200]
    failures = f.state_while_failing["failures"]
    assert failures.get("http_5xx", 0) + failures.get("passed_over", 0) >= 3
    f.assert_avoided_then_back()
    # The dashboard says what happened, and every endpoint has a state series.
    assert stack.sidecar is not None and stack.fleet is not None
    metrics = stack.sidecar.metrics_text()
    assert sum_by_label(metrics, "loadaware_endpoint_ejections_total", "endpoint").get(f.victim, 0) >= 1
    assert sum_by_label(metrics, "loadaware_responses_total", "code").get("2xx", 0) > 100
    healthy = sum_by_label(metrics, "loadaware_endpoint_routing_state", "endpoint")  # one state at 1 each
    assert healthy == {ep: 1.0 for ep in stack.fleet.endpoints}, healthy


async def test_hung_engine_times_out_per_route_and_is_avoided(hang_stack: Stack) -> None:
    f = await run_scenario(hang_stack, "hang", fault_s=8.0, healed_s=4.0)
    timed_out = [s for s in f.sender.window(f.onset - 1.0, f.healed) if s.status == 504]
    steady = f.sender.window(f.onset + f.detected_after_s + 0.5, f.healed)
    rate = success_rate(steady)
    latencies = [s.latency for s in timed_out] or [0.0]
    print(f"\nhung engine: {len(timed_out)} requests ended in 504 after {min(latencies):.2f}-{max(latencies):.2f} s; "
          f"then {rate:.2%} of {len(steady)} succeeded; {f.describe()}")
    # Requests caught on the hung engine end per the route's timeout, not never.
    assert timed_out, "no request was caught on the hung engine"
    assert all(ROUTE_TIMEOUT_S - 0.2 <= s.latency <= ROUTE_TIMEOUT_S + 2.0 for s in timed_out)
    assert f.state_while_failing["reason"] == "unreachable"
    assert rate >= 0.99
    f.assert_avoided_then_back()
