"""Session affinity (loadaware/routing/affinity.py): the bindings' bounds, the saturation rule, the decider
keeping a session on its endpoint (and moving it when it cannot take the request), pruned large pools, previews,
failing open, the settings, and requests through the real ext_proc servicer in both modes."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import pytest
from envoy.config.core.v3 import base_pb2

from bench.extproc_inprocess import buffered_messages, duplex_messages
from loadaware.app import Sidecar
from loadaware.config import ConfigError, from_args
from loadaware.fleet.health import EndpointHealth, HealthOptions
from loadaware.fleet.registry import EndpointRegistry
from loadaware.lifecycle import Decision, RequestLifecycle
from loadaware.load.order import LoadOrder
from loadaware.load.tracker import EngineStats, LoadTracker
from loadaware.policies import Candidate, make_policy, ranked
from loadaware.routing.affinity import EXPIRED_DROPPED_PER_BINDING, SessionAffinity, saturated
from loadaware.routing.builder import build_decider
from loadaware.routing.pruning import MIN_POOL, pruned_candidates
from loadaware.routing.request import InferenceRequest
from tests.unit.test_extproc_duplex import Recorder

FLEET = ("127.0.0.2:8000", "127.0.0.3:8000", "127.0.0.4:8000", "127.0.0.5:8000")
REQUEST = InferenceRequest("completions", prompt=list(range(64)))


# ---- the bindings ----

def test_a_session_is_bound_until_idle_past_the_ttl() -> None:
    store = SessionAffinity(max_entries=10, ttl_s=600)
    assert store.sticky("s", 0.0) is None
    store.remember("s", "a", 0.0)
    assert store.sticky("s", 600.0) == "a"
    assert store.sticky("s", 600.5) is None  # idle too long: forgotten for lookups at once
    store.remember("s", "b", 700.0)
    assert store.sticky("s", 1000.0) == "b" and len(store) == 1


def test_the_least_recently_used_session_goes_first() -> None:
    store = SessionAffinity(max_entries=3, ttl_s=600)
    for i, s in enumerate("abc"):
        store.remember(s, f"ep{i}", float(i))
    store.remember("a", "ep0", 3.0)  # used again: the hot end
    store.remember("d", "ep3", 4.0)
    assert len(store) == 3
    assert store.sticky("b", 4.0) is None  # the coldest went
    assert [store.sticky(s, 4.0) for s in "acd"] == ["ep0", "ep2", "ep3"]


def test_expired_sessions_leave_a_few_per_binding() -> None:
    store = SessionAffinity(max_entries=1000, ttl_s=10)
    for i in range(100):
        store.remember(f"s{i}", "a", 0.0)
    store.remember("new", "b", 100.0)  # all 100 expired: only a few go per binding (O(1) per request)
    assert len(store) == 101 - EXPIRED_DROPPED_PER_BINDING
    for i in range(40):
        store.remember(f"n{i}", "b", 100.0)
    assert len(store) == 41  # the expired ones are all gone, the live ones stay


def test_a_session_follows_the_engine_that_served_unless_rebound_since() -> None:
    store = SessionAffinity()
    store.remember("s", "a", 0.0)
    store.follow("s", "a", "b", 1.0)
    assert store.sticky("s", 1.0) == "b"
    store.follow("s", "a", "c", 2.0)  # an older request's retry: the newer binding stands
    assert store.sticky("s", 2.0) == "b"
    store.follow("unknown", "a", "c", 2.0)
    assert store.sticky("unknown", 2.0) is None


def test_bounds_are_checked() -> None:
    with pytest.raises(ValueError):
        SessionAffinity(max_entries=0)
    with pytest.raises(ValueError):
        SessionAffinity(ttl_s=0)


# ---- the saturation rule ----

def test_saturated_past_the_guard_or_queueing_while_another_is_not() -> None:
    cands = [Candidate("a", 0, 2.0), Candidate("b", 0, 1.0), Candidate("c", 0, 1.0)]
    no_queue = {"a": 0.0, "b": 0.0, "c": 0.0}
    assert not saturated(cands[0], cands, 3, lambda c: no_queue[c.endpoint])  # 2 + 1 <= 3
    assert saturated(cands[0], cands, 2, lambda c: no_queue[c.endpoint])
    assert not saturated(cands[0], cands, None, lambda c: no_queue[c.endpoint])  # an unbounded pool
    queue = {"a": 2.0, "b": 0.0, "c": 1.0}
    assert saturated(cands[0], cands, None, lambda c: queue[c.endpoint])  # b does not queue
    everyone = {"a": 2.0, "b": 1.0, "c": 1.0}
    assert not saturated(cands[0], cands, None, lambda c: everyone[c.endpoint])  # nowhere better to go


# ---- the decider ----

class Rig:
    def __init__(self, policy: str = "leastload", fleet: Sequence[str] = FLEET, ranking: bool = False,
                 affinity: bool = True, fallbacks: int = 2) -> None:
        self.now = [100.0]
        clock = lambda: self.now[0]  # noqa: E731
        self.loads = LoadTracker(stale_s=5, clock=clock)
        self.registry = EndpointRegistry(fleet)
        for ep in fleet:
            self.loads.join(ep)
        self.lifecycle = RequestLifecycle()
        self.lifecycle.subscribe(self.loads)
        self.health = EndpointHealth(HealthOptions(failures_to_eject=1, base_ejection_s=1000, max_ejection_s=1000,
                                                   max_ejection_percent=100), clock=clock)
        self.lifecycle.subscribe(self.health)
        self.affinity = SessionAffinity(1000, 600, clock=clock) if affinity else None
        self.decider = build_decider(
            make_policy(policy), self.registry, self.loads, self.lifecycle, fallbacks=fallbacks,
                               health=self.health, ranking=self.loads if ranking else None, affinity=self.affinity)

    async def decide(self, session: str = "", count: bool = True, end: bool = True,
                     subset: frozenset[str] | None = None) -> Decision:
        decision = await self.decider.decide(REQUEST, "r", count=count, session=session, subset=subset)
        if end and count:
            self.lifecycle.ended(decision)
        return decision

    def hold(self, endpoint: str, n: int) -> None:
        for _ in range(n):
            self.loads.acquire(endpoint)


async def test_a_session_sticks_to_its_endpoint_while_the_policy_would_spread() -> None:
    rig = Rig()
    first = await rig.decide("alice")
    home = first.endpoint
    assert home == FLEET[0] and first.affinity == "new" and first.outcome == "routed" and first.reasons == ()
    rig.hold(home, 2)  # busier than the others, within the pile-up guard: cap = ceil(0.5 x (2 + 3 + 1)) = 3
    for other in FLEET[1:]:
        rig.hold(other, 1)
    again = await rig.decide("alice")
    assert again.endpoint == home and again.affinity == "kept"
    assert again.outcome == "routed" and again.reasons == ()  # not a degraded decision: no fallback counted
    # The policy's ranking supplies the fallbacks after it: the least loaded others, lexically.
    assert again.ranked == (home, FLEET[1], FLEET[2])
    bob = await rig.decide("bob")
    assert bob.endpoint == FLEET[1] and bob.affinity == "new"  # leastload: the lexically first of the idlest
    plain = await rig.decide()
    assert plain.affinity == "" and plain.endpoint == FLEET[1]


async def test_a_saturated_endpoint_passes_the_session_on_and_it_follows() -> None:
    rig = Rig()
    home = (await rig.decide("alice")).endpoint
    assert home is not None
    rig.hold(home, 5)  # past the guard: cap = ceil(0.5 x (5 + 1)) = 3
    moved = await rig.decide("alice")
    assert moved.affinity == "moved" and moved.endpoint != home and moved.outcome == "routed"
    assert rig.affinity is not None and rig.affinity.sticky("alice", rig.now[0]) == moved.endpoint
    again = await rig.decide("alice")
    assert again.endpoint == moved.endpoint and again.affinity == "kept"


async def test_a_queueing_endpoint_passes_the_session_on_unless_everyone_queues() -> None:
    rig = Rig()
    home = (await rig.decide("alice")).endpoint
    assert home == FLEET[0]
    # Loads 3 (home: 2 running, 1 waiting) and 2: within the guard (cap ceil(0.5 x (9 + 1)) = 5).
    for ep in FLEET:
        rig.loads.record(ep, EngineStats(2.0, 1.0 if ep == home else 0.0, None, rig.now[0]))
    moved = await rig.decide("alice", end=False)
    assert moved.affinity == "moved" and moved.endpoint != home  # home queues while the others do not
    rig.lifecycle.ended(moved)
    rig.affinity.remember("alice", home, rig.now[0])  # type: ignore[union-attr]
    for ep in FLEET:
        rig.loads.record(ep, EngineStats(2.0 if ep == home else 1.0, 1.0, None, rig.now[0]))
    kept = await rig.decide("alice")
    assert kept.affinity == "kept" and kept.endpoint == home  # everyone queues: nowhere better to go


async def test_an_unhealthy_or_departed_endpoint_loses_the_session_which_follows() -> None:
    rig = Rig()
    home = (await rig.decide("alice")).endpoint
    assert home is not None
    rig.health.failed(home, "http_5xx")  # ejected
    moved = await rig.decide("alice")
    assert moved.affinity == "moved" and moved.endpoint not in (home, None)
    rig.health.succeeded(home)  # healed: the session stays where it went
    assert (await rig.decide("alice")).endpoint == moved.endpoint
    assert moved.endpoint is not None
    rig.registry.set(tuple(ep for ep in FLEET if ep != moved.endpoint))  # its engine left the fleet
    last = await rig.decide("alice")
    assert last.affinity == "moved" and last.endpoint in rig.registry.snapshot()
    # Outside the proxy's subset is not a candidate either.
    assert last.endpoint is not None
    elsewhere = frozenset(ep for ep in rig.registry.snapshot() if ep != last.endpoint)
    hinted = await rig.decide("alice", subset=elsewhere)
    assert hinted.endpoint in elsewhere and hinted.affinity == "moved"


async def test_a_response_from_another_engine_moves_the_session() -> None:
    rig = Rig()
    decision = await rig.decide("alice", end=False)
    assert decision.endpoint == FLEET[0]
    rig.lifecycle.served(decision, FLEET[2])  # the proxy's retry walked the ranked list
    rig.lifecycle.ended(decision)
    assert (await rig.decide("alice")).endpoint == FLEET[2]


async def test_explain_reads_the_binding_and_never_changes_it() -> None:
    rig = Rig()
    preview = await rig.decide("alice", count=False)
    assert preview.affinity == "new" and rig.affinity is not None and len(rig.affinity) == 0
    home = (await rig.decide("alice")).endpoint
    rig.now[0] += 500
    assert (await rig.decide("alice", count=False)).affinity == "kept"
    rig.now[0] += 200  # 700 s after the last counted decision: the preview did not refresh it
    assert rig.affinity.sticky("alice", rig.now[0]) is None
    assert (await rig.decide("alice")).affinity == "new"
    rig.now[0] += 500
    assert (await rig.decide("alice")).affinity == "kept"  # a counted decision refreshed it
    assert home is not None


async def test_affinity_off_costs_nothing_and_binds_nothing() -> None:
    rig = Rig(affinity=False)
    decision = await rig.decide("alice")
    assert decision.affinity == "" and decision.reasons == () and rig.decider.affinity is None


async def test_the_record_shows_what_affinity_did_never_the_key() -> None:
    rig = Rig()
    shown = (await rig.decide("secret-user-42")).as_dict()
    assert shown["affinity"] == "new" and "secret-user-42" not in repr(shown)


class Broken(SessionAffinity):
    def __init__(self, fail: str) -> None:
        super().__init__()
        self.fail = fail

    def sticky(self, session: str, now: float) -> str | None:
        if self.fail == "sticky":
            raise RuntimeError("boom")
        return FLEET[3]

    def remember(self, session: str, endpoint: str, now: float) -> None:
        if self.fail == "remember":
            raise RuntimeError("boom")


@pytest.mark.parametrize("fail", ["sticky", "remember"])
async def test_a_failing_store_degrades_to_the_normal_decision(fail: str) -> None:
    rig = Rig()
    assert rig.decider.stickiness is not None
    rig.decider.stickiness.affinity = Broken(fail)
    decision = await rig.decide("alice")
    assert decision.endpoint is not None and "affinity_error" in decision.reasons
    assert decision.outcome == "fallback_load_only"  # counted like any failing helper
    if fail == "sticky":
        assert decision.endpoint == FLEET[0]  # the policy's choice


# ---- large, pruned pools ----

def big_fleet(n: int = 100) -> list[str]:
    return [f"10.0.{i // 250}.{i % 250 + 1}:8000" for i in range(n)]


async def test_a_pruned_pool_still_scores_and_honours_the_sticky_endpoint() -> None:
    eps = big_fleet(100)
    rig = Rig(policy="loadaware", fleet=eps, ranking=True)
    for ep in eps:
        rig.hold(ep, 1)
    sticky = eps[57]
    rig.hold(sticky, 4)  # 5 in flight: far from the least loaded, within the pool's cap (ceil(0.5 x 105) = 53)
    assert rig.affinity is not None
    rig.affinity.remember("alice", sticky, rig.now[0])
    decision = await rig.decide("alice")
    assert decision.pool_size == 100 and len(decision.candidates) < 10  # pruned
    assert decision.endpoint == sticky and decision.affinity == "kept"
    plain = await rig.decide()
    assert plain.endpoint != sticky and sticky not in {c.endpoint for c in plain.candidates}
    # Its fallbacks are the policy's: the ranking without the session, after it.
    assert decision.ranked[1:] == plain.ranked[:2]


@pytest.mark.parametrize("policy_name", ["loadaware", "kvaware", "leastload"])
def test_a_kept_endpoint_leaves_the_pruned_ranking_as_the_full_pool(policy_name: str) -> None:
    """pruned_candidates(keep=...) adds the kept endpoint and changes neither the choice nor the fallbacks."""
    rng = random.Random(f"affinity-pruning-{policy_name}")
    for case in range(150):
        eps = big_fleet(rng.randrange(MIN_POOL, 200))
        rng.shuffle(eps)
        loads = {ep: rng.randrange(8) / 2 for ep in eps}
        prompt = rng.choice((16, 160))
        holders = rng.sample(eps, rng.choice((0, 1, 5)))
        matches = {ep: rng.choice((16, prompt)) for ep in holders}
        excluded = frozenset(rng.sample(eps, rng.choice((0, 2))))
        keep = rng.choice(eps)
        limit = 1 + rng.randrange(4)
        order = LoadOrder()
        for ep in eps:
            order.set(ep, loads[ep])
        position = {ep: i for i, ep in enumerate(eps)}.__getitem__
        pool = tuple(eps)
        pruned, mean = pruned_candidates(order, pool, frozenset(pool), True, matches, prompt, limit, position,
                                         excluded, keep)
        names = [c.endpoint for c in pruned]
        assert (keep in names) == (keep not in excluded), f"case {case}"
        policy = make_policy(policy_name, 1.0)
        choice = policy.choose(prompt, pruned, mean)
        assert choice is not None
        eligible = tuple(ep for ep in pool if ep not in excluded)
        full = tuple(Candidate(ep, min(matches.get(ep, 0), prompt), loads[ep]) for ep in eligible)
        want = policy.choose(prompt, full)
        assert want is not None
        assert [names[i] for i in ranked(choice, pruned, limit)] == \
            [full[i].endpoint for i in ranked(want, full, limit)], f"case {case}"


# ---- settings ----

def settings(*flags: str, environ: dict[str, str] | None = None) -> Any:
    return from_args(["--endpoints", FLEET[0], *flags], environ=environ or {})


def test_the_session_settings() -> None:
    s = settings()
    assert s.session_header == "" and s.session_max_entries == 100_000 and s.session_ttl_s == 600
    s = settings("--session-header", " X-Session-ID ", "--session-max-entries", "5", "--session-ttl-s", "30")
    assert (s.session_header, s.session_max_entries, s.session_ttl_s) == ("x-session-id", 5, 30.0)
    assert settings(environ={"LOADAWARE_SESSION_HEADER": "x-user"}).session_header == "x-user"
    for bad in ("x session", "x:session", ":authority", "sessión", "x\nsession", "a/b"):
        with pytest.raises(ConfigError, match="--session-header"):
            settings("--session-header", bad)
    with pytest.raises(ConfigError, match="LOADAWARE_SESSION_HEADER"):  # strict: not silently off
        settings(environ={"LOADAWARE_SESSION_HEADER": "bad header"})
    with pytest.raises(ConfigError, match="--session-header"):
        settings("--session-header", "x-gateway-destination-endpoint")
    for flag in ("--session-max-entries", "--session-ttl-s"):
        with pytest.raises(ConfigError, match=flag):
            settings(flag, "0")


def test_the_cli_refuses_a_bad_session_header_with_exit_2() -> None:
    from loadaware.cli import main

    assert main(["config", "--endpoints", FLEET[0], "--session-header", "no good"]) == 2


# ---- through the ext_proc servicer ----

def sidecar(*flags: str) -> Sidecar:
    return Sidecar(from_args(["--endpoints", ",".join(FLEET[:3]), "--metrics-listen", "off", "--policy",
                              "leastload", "--session-header", "x-session-id", *flags], environ={}))


def with_header(messages: list[Any], key: str, value: bytes) -> list[Any]:
    messages[0].request_headers.headers.headers.append(base_pb2.HeaderValue(key=key, raw_value=value))
    return messages


BODY = b'{"model": "m", "prompt": "hello there", "max_tokens": 8}'


async def routed(app: Sidecar, duplex: bool, session: bytes | None) -> Decision:
    messages = duplex_messages(BODY, chunks=1) if duplex else buffered_messages(BODY)
    if session is not None:
        with_header(messages, "x-session-id", session)
    await app.extproc.process(None, Recorder(messages))
    return app.recent.items[-1]


@pytest.mark.parametrize("duplex", [True, False])
async def test_the_servicer_keeps_a_session_on_its_engine_while_others_spread(duplex: bool) -> None:
    app = sidecar()
    first = await routed(app, duplex, b"alice")
    assert first.endpoint == FLEET[0] and first.affinity == "new"
    app.loads.acquire(FLEET[0])  # other traffic: leastload now prefers the third engine
    app.loads.acquire(FLEET[1])
    again = await routed(app, duplex, b"alice")
    assert again.endpoint == FLEET[0] and again.affinity == "kept" and again.outcome == "routed"
    assert (await routed(app, duplex, None)).endpoint == FLEET[2]
    bob = await routed(app, duplex, b"bob")
    assert bob.endpoint == FLEET[2] and bob.affinity == "new"
    assert app.loads.total() == 2  # every stream's own count released


@pytest.mark.parametrize("duplex", [True, False])
async def test_hostile_session_bytes_are_a_bounded_key(duplex: bool) -> None:
    app = sidecar()
    hostile = b"\xff\xfe\x00\r\nx-injected: 1\x1b[31m" + b"\x80" * 10_000
    first = await routed(app, duplex, hostile)
    assert first.endpoint is not None and first.outcome == "routed" and first.affinity == "new"
    app.loads.acquire(FLEET[0])
    app.loads.acquire(FLEET[1])
    again = await routed(app, duplex, hostile)
    assert again.endpoint == first.endpoint and again.affinity == "kept"
    assert app.decider.affinity is not None
    keys = list(app.decider.affinity._entries)
    assert len(keys) == 1 and len(keys[0]) <= 128 and keys[0].isprintable()
    empty = await routed(app, duplex, b"")
    assert empty.affinity == ""  # an empty value is no session


def test_the_app_wires_affinity_only_when_a_header_is_named() -> None:
    off = Sidecar(from_args(["--endpoints", FLEET[0], "--metrics-listen", "off"], environ={}))
    assert off.decider.affinity is None and off.extproc.duplex.options.session_header == ""
    on = sidecar("--session-max-entries", "7", "--session-ttl-s", "9")
    assert on.extproc.buffered.options.session_header == "x-session-id"
    assert on.decider.affinity is not None and (on.decider.affinity.max_entries, on.decider.affinity.ttl_s) == (7, 9)


def test_a_full_store_takes_new_sessions_without_growing() -> None:
    store = SessionAffinity(max_entries=50_000, ttl_s=600)
    for i in range(50_000):
        store.remember(f"s{i}", "a", 0.0)
    for i in range(50_000):
        store.remember(f"t{i}", "b", 1.0)
    assert len(store) == 50_000 and store.sticky("s0", 1.0) is None and store.sticky("t0", 1.0) == "b"
