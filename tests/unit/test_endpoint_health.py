"""Failure-aware routing's state machine (loadaware/fleet/health.py), on a fake clock."""

from __future__ import annotations

from loadaware.fleet.health import EJECTED, HEALTHY, PROBING, EndpointHealth, HealthOptions
from loadaware.lifecycle import Decision, RequestLifecycle

A, B, C = "10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"
FLEET = (A, B, C)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def make(**options: float) -> tuple[EndpointHealth, Clock, list[tuple[str, str, str]]]:
    clock = Clock()
    changes: list[tuple[str, str, str]] = []
    health = EndpointHealth(HealthOptions(**options), clock=clock,  # type: ignore[arg-type]
                            on_change=lambda *change: changes.append(change))
    return health, clock, changes


def decision(endpoint: str | None, ranked: tuple[str, ...] = ()) -> Decision:
    ranked = ranked or ((endpoint,) if endpoint else ())
    return Decision("r", endpoint, "routed", (), 0, (), (), {}, 0.0, ranked=ranked, served_reported=True)


def test_consecutive_failures_eject_and_successes_reset_the_count() -> None:
    health, _, changes = make()
    health.failed(A, "http_5xx")
    health.failed(A, "http_5xx")
    health.succeeded(A)  # the streak is broken
    health.failed(A, "http_5xx")
    health.failed(A, "http_5xx")
    assert health.eligible(FLEET) == FLEET
    health.failed(A, "timeout")
    assert health.eligible(FLEET) == (B, C)
    assert changes == [(A, EJECTED, "timeout")]
    view = health.view(A)
    assert view.state == EJECTED and view.failures == {"http_5xx": 4, "timeout": 1} and view.successes == 1


def test_backoff_doubles_up_to_the_cap_and_a_probe_success_heals() -> None:
    health, clock, _ = make(failures_to_eject=1, base_ejection_s=1.0, max_ejection_s=3.0)
    lengths = []
    for _ in range(4):
        health.failed(A, "http_5xx")
        assert health.state(A) == EJECTED
        lengths.append(health.view(A).ejected_for_s)
        clock.now += lengths[-1] - 0.01
        assert A not in health.eligible(FLEET)  # not yet
        clock.now += 0.01
        assert health.eligible(FLEET) == FLEET  # due: probing
        assert health.state(A) == PROBING
    assert lengths == [1.0, 2.0, 3.0, 3.0]
    health.succeeded(A)
    assert health.state(A) == HEALTHY
    health.failed(A, "http_5xx")  # the backoff starts over after a heal
    assert health.view(A).ejected_for_s == 1.0


def test_probing_admits_one_request_at_a_time() -> None:
    health, clock, _ = make(failures_to_eject=1)
    health.failed(A, "http_5xx")
    clock.now += 5
    assert A in health.eligible(FLEET)
    probe = decision(A)
    health.on_decided(probe)
    assert health.eligible(FLEET) == (B, C)  # its one probe is in flight
    health.on_decided(decision(B))
    health.on_ended(probe)  # ended without an outcome (client abort): the slot frees
    assert A in health.eligible(FLEET)
    second = decision(A)
    health.on_decided(second)
    health.on_responded(second, 500)  # the probe failed: ejected again, for longer
    assert health.state(A) == EJECTED and health.view(A).ejections == 2


def test_an_engine_walked_past_by_the_proxys_retries_failed() -> None:
    health, _, _ = make(failures_to_eject=2)
    for _ in range(2):
        d = decision(A, (A, B, C))
        d.served = C  # A and B were tried and failed, C answered
        health.on_responded(d, 200)
    assert health.state(A) == EJECTED and health.view(A).reason == "passed_over"
    assert health.state(B) == EJECTED
    assert health.state(C) == HEALTHY and health.view(C).successes == 2


def test_a_4xx_is_the_clients_problem_and_a_504_is_a_timeout() -> None:
    health, _, _ = make(failures_to_eject=1)
    health.on_responded(decision(A), 404)
    assert health.state(A) == HEALTHY
    health.on_responded(decision(B), 504)
    assert health.view(B).reason == "timeout"


def test_only_upstream_statuses_count_against_an_engine() -> None:
    health, _, _ = make(failures_to_eject=1, max_ejection_percent=100)
    for status in (400, 404, 413, 429, 499, 501, 505, 511):  # statuses a client's own request can earn
        health.on_responded(decision(A), status)
    assert health.state(A) == HEALTHY and health.view(A).failures == {}
    for endpoint, status in ((A, 500), (B, 502), (C, 503)):
        health.on_responded(decision(endpoint), status)
        assert health.state(endpoint) == EJECTED and health.view(endpoint).reason == "http_5xx"


def test_a_response_without_the_proxys_served_report_is_the_proxys_own() -> None:
    health, _, _ = make(failures_to_eject=1)
    local = decision(A, (A, B))
    local.served_reported = False  # e.g. Envoy's local reply before any engine was reached
    health.on_responded(local, 503)
    assert health.state(A) == HEALTHY and health.state(B) == HEALTHY and health.view(A).failures == {}


def test_the_ejected_share_is_capped_and_the_soonest_due_come_back() -> None:
    health, clock, _ = make(failures_to_eject=1)  # 50%, as Envoy's outlier detection
    health.failed(A, "http_5xx")
    clock.now += 0.5
    health.failed(B, "http_5xx")  # due back half a second after A
    assert health.eligible(FLEET) == (A, C)  # 2 of 3 out would exceed 50%: A, due first, is readmitted
    four = (*FLEET, "10.0.0.4:8000")
    assert health.eligible(four) == (C, "10.0.0.4:8000")  # 2 of 4 is within the cap
    health.failed(C, "http_5xx")
    assert health.eligible(four) == (A, "10.0.0.4:8000")  # 3 of 4 out: A, due first, returns
    assert health.eligible((A,)) == ()  # one candidate can be ejected (the caller fails open)
    health.scrape_failed("10.0.0.4:8000")
    health.scrape_failed("10.0.0.4:8000")  # unreachable: readmitted only after every timed ejection
    assert health.eligible(four) == (A, B)


def test_eligibility_is_a_pure_query() -> None:
    health, clock, changes = make(failures_to_eject=1)
    health.failed(A, "http_5xx")
    clock.now += 10  # due for its probe
    before = (health.view(A), list(changes))
    for _ in range(5):
        assert A in health.eligible(FLEET)
    assert (health.view(A), changes) == before  # asking changes nothing: only a routed request probes
    probe = decision(A)
    health.on_decided(probe)
    assert changes[-1] == (A, PROBING, "http_5xx") and A not in health.eligible(FLEET)


def test_unreachable_waits_for_a_scrape_not_for_the_clock() -> None:
    health, clock, _ = make(unreachable_after=2)
    health.scrape_failed(A)
    assert health.eligible(FLEET) == FLEET
    health.scrape_failed(A)
    assert health.state(A) == EJECTED and health.view(A).reason == "unreachable"
    clock.now += 3600
    assert A not in health.eligible(FLEET)  # a hung engine is not probed with a client's request
    health.succeeded(A)  # a late answer from before does not readmit it either
    assert health.state(A) == EJECTED
    health.scrape_ok(A)
    assert health.state(A) == PROBING and A in health.eligible(FLEET)
    probe = decision(A)
    health.on_decided(probe)
    health.on_responded(probe, 200)
    assert health.state(A) == HEALTHY


def test_scrape_successes_do_not_heal_request_failures() -> None:
    health, _, _ = make(failures_to_eject=1)
    health.failed(A, "http_5xx")
    health.scrape_ok(A)
    assert health.state(A) == EJECTED


def test_zero_thresholds_never_eject() -> None:
    health, _, _ = make(failures_to_eject=0, unreachable_after=0)
    for _ in range(10):
        health.failed(A, "http_5xx")
        health.scrape_failed(A)
    assert health.eligible(FLEET) == FLEET and health.view(A).failures["http_5xx"] == 10


def test_every_endpoint_out_leaves_nothing_eligible_and_forget_clears() -> None:
    health, _, _ = make(failures_to_eject=1, max_ejection_percent=100)
    for ep in FLEET:
        health.failed(ep, "http_5xx")
    assert health.eligible(FLEET) == ()
    health.forget(A)
    assert health.eligible(FLEET) == (A,) and health.state(A) == HEALTHY


def test_the_lifecycle_carries_the_response_status_once() -> None:
    lifecycle = RequestLifecycle()
    health, _, _ = make(failures_to_eject=1)
    lifecycle.subscribe(health)
    lifecycle.subscribe_outcomes(health)
    d = decision(A, (A, B))
    lifecycle.decided(d)
    lifecycle.responded(d, 200, B)  # a retry moved it to B: A failed, B served
    assert d.served == B and d.status == 200
    assert health.state(A) == EJECTED and health.view(B).successes == 1
    lifecycle.responded(d, 500, B)  # one response per request: a repeat tells nothing
    assert health.state(B) == HEALTHY
    unrouted = decision(None)
    lifecycle.responded(unrouted, 500, C)  # Envoy's fallback picked: nothing to attribute
    assert health.state(C) == HEALTHY
