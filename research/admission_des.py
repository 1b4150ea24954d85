"""Admission in virtual time: the sidecar's own admission controller, load tracker and room rule over simulated
engines, with no machine in the way.

`bench.admission` measures the critical band's TTFT through the real Envoy, sidecar and engines on 2 shared cores,
where twice the request rate alone moves a p95 of ~8 ms by more than the 1.2x target allows (docs/results.md).
This runs the same traffic through the product's `AdmissionController`, `PoolRoom` and `LoadTracker` on an asyncio
loop whose clock jumps to the next event: the only delays are the ones modelled, so what the critical band waits
is admission's own doing (and the engines' queues').

    python -m research.admission_des [--seeds 1-10] [--loads 0.7,1.5] [--rules shipped,per-engine,no-k,off]
        [--duration-s 80]
    python -m research.admission_des --draw 60 --seeds 301 [--rules ...]

The first form runs the bench's operating point (2 engines of 8 slots, its mix) at each load over the seeds; the
second draws that many operating points at random (draw_point: fleets, loads and mixes nobody tuned on), one run
each.

Modelled: engines as `sim.engine_core` runs them (FIFO admission up to their batch slots, a prefill of PREFILL_MS,
then MAX_TOKENS decode steps of the bench's --slower 2 step, first token after the prefill); the bench's objectives,
time to live and bounds (bench/admission.py); a scrape of each engine every SCRAPE_S that reaches the sidecar
SCRAPE_LAG_S after it was read; a request reaches its engine HOP_S after its decision, and its end reaches the
sidecar HOP_S after the engine finished it. The policy is least load (the tracker's), then the room rule
(routing/room.py). Printed per rule: the critical band's delay (admission wait + engine queue) at p50, p95 and
p99, how many of its requests were delayed over 1 and 50 ms, in how many runs its p95 delay stayed within WITHIN_S
(the bench's target: 1.2x of its ~8 ms p95 at 0.7x), the standard band's TTFT p95, the batch band's requests
served and shed, the standard band's requests placed into full batches past their time to live; with --draw, the
runs within the target apart for points whose wait floor (wait_floor: what no rule can avoid without starving
the standard band) is under 5% and at or above it. Not modelled: CPU, the gateway, tokens beyond a fixed prompt.

Rules (the lower bands' room; the top band takes any free slot in all of them):
    shipped      the product's default: --reserved-slots auto (loadaware/admission/reserve.py)
    auto:S:L     the same with other shares of the top band's arrivals allowed to find no free slot (S on time,
                 L late)
    per-engine   --reserved-slots 1 --late-reserved-slots 1 (the default before auto): one slot per engine, and
                 for a lower band on time as many more as the top band has in flight
    no-k         per-engine without the top band's in flight
    sheddable-k  per-engine with the top band's in flight in the sheddable band's reserve only
    off          admission off: every request placed at once
"""

from __future__ import annotations

import argparse
import asyncio
import math
import random
import selectors
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from bench.admission import DECODE_MS, MAX_HELD, MAX_HELD_BYTES, MAX_TOKENS, MIX, OBJECTIVES, TTL_S
from loadaware.admission.controller import LOWER, AdmissionController, AdmissionSettings, Verdict
from loadaware.admission.objectives import Objectives
from loadaware.admission.saturation import PoolRoom
from loadaware.lifecycle import Decision
from loadaware.load.tracker import EngineStats, LoadTracker

PREFILL_MS = 2.0  # the bench's engines: --prefill-overhead-ms 2, a few tokens at 200,000 tokens/s
SCRAPE_S = 0.1  # the bench's --scrape-interval-s
SCRAPE_LAG_S = 0.002
HOP_S = 0.0005
STALE_S = 1.0
BODY_BYTES = 200
# A seed holds the target when its critical p95 delay is within this: 1.2x of the bench's ~8 ms p95 at 0.7x.
WITHIN_S = 0.0016
FLOOR_SHARE = 0.05  # a p95: at most 5% of the top band's arrivals may wait (wait_floor)


class _JumpingSelector(selectors.SelectSelector):
    """Never waits: a wait for the next timer moves the loop's clock to it."""

    def __init__(self, loop: VirtualLoop) -> None:
        super().__init__()
        self.loop = loop

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout is None:
            raise RuntimeError("nothing scheduled: the simulation would wait forever")
        self.loop.now += max(0.0, timeout)
        return []


class VirtualLoop(asyncio.SelectorEventLoop):
    def __init__(self) -> None:
        self.now = 0.0
        super().__init__(selector=_JumpingSelector(self))

    def time(self) -> float:
        return self.now


class Engine:
    """FIFO admission up to `slots`; a request holds its slot for the prefill and MAX_TOKENS decode steps."""

    def __init__(self, name: str, slots: int, decode_s: float) -> None:
        self.name, self.slots, self.decode_s = name, slots, decode_s
        self.running = 0
        self.waiting: deque[Callable[[], None]] = deque()

    def submit(self, start: Callable[[], None]) -> None:
        if self.running < self.slots:
            self.running += 1
            start()
        else:
            self.waiting.append(start)

    def finished(self) -> None:
        if self.waiting:
            self.waiting.popleft()()  # its slot passes on
        else:
            self.running -= 1


@dataclass(frozen=True)
class Point:
    """An operating point: the fleet, the offered load (x its capacity) and the shares of the top and standard
    bands in the offered traffic (the sheddable batch band has the rest)."""

    engines: int = 2
    slots: int = 8
    load: float = 1.5
    critical: float = 0.10
    standard: float = 0.50

    def mix(self) -> list[tuple[str, str, float]]:
        s = self.standard
        return [("critical", "tenant-a", self.critical), ("standard", "tenant-heavy", s * 10 / 11),
                ("standard", "tenant-light", s / 11), ("batch", "tenant-a", 1 - self.critical - s)]

    def at(self, load: float) -> Point:
        return replace(self, load=load)


BENCH_POINT = Point(critical=MIX[0][2], standard=MIX[1][2] + MIX[2][2])


def draw_point(rng: random.Random) -> Point:
    """A point nobody tuned on: 2-8 engines of 4-32 slots, 1.2-2x their capacity, a top band of 5-20% of the
    traffic and a standard band that leaves the two together within 50-95% of the capacity (more than 100% and no
    rule can serve both)."""
    load = round(rng.uniform(1.2, 2.0), 2)
    critical = round(rng.uniform(0.05, 0.20), 3)
    together = rng.uniform(0.50, 0.95) / load
    return Point(rng.randint(2, 8), rng.choice((4, 8, 16, 32)), load, critical,
                 math.floor(max(0.0, together - critical) * 1000) / 1000)


def wait_floor(point: Point) -> float:
    """The least share of the top band's arrivals that must find no free slot, whatever the rule, if the standard
    band is to be served within its time to live: the two bands that cannot be shed keep D = (critical + standard)
    x load x slots of the pool's S slots busy on average, so at most S - D stay free; a top-band arrival finds none
    with probability about rho^(free slots) (loadaware/admission/reserve.py's chain), rho = critical x load (its
    arrivals per end of a full pool). Above 5% its p95 cannot hold without starving the standard band."""
    slots = point.engines * point.slots
    free = slots * (1.0 - (point.critical + point.standard) * point.load)
    rho = point.critical * point.load
    return 1.0 if free <= 0 else min(1.0, rho ** free)


class Off(AdmissionController):
    """Admission off: every request placed at once, where the policy picks."""

    async def admit(self, objective: str, fairness_id: str, size: int, request_id: str = "",
                    on_hold: Any = None) -> Verdict:
        return Verdict(True, self.objectives.priority(objective), "admitted")

    def room_for(self, verdict: Verdict) -> Callable[[str], bool]:
        return lambda endpoint: True


def rule_setup(rule: str) -> tuple[type[AdmissionController], dict[str, Any]]:
    """The controller class and its settings for `rule` (see the module's docstring)."""
    if rule == "shipped":
        return AdmissionController, {}
    if rule.startswith("auto:"):  # auto:SHARE:LATE_SHARE
        _, share, late = rule.split(":")
        return AdmissionController, {"top_wait_share": float(share), "late_top_wait_share": float(late)}
    if rule == "off":
        return Off, {}
    per_engine = {"reserved_slots": 1, "late_reserved_slots": 1}
    if rule == "per-engine":
        return AdmissionController, per_engine
    if rule in ("no-k", "sheddable-k"):
        return without_top_inflight(sheddable_keeps=rule == "sheddable-k"), per_engine
    raise ValueError(f"unknown rule {rule!r}")


def without_top_inflight(sheddable_keeps: bool) -> type[AdmissionController]:
    """per-engine without the top band's requests in flight in a lower band's reserve (no-k), or only in the
    sheddable band's (sheddable-k: the pump's one budget for the lower bands is the band held first's, for the
    whole pump)."""

    class Variant(AdmissionController):
        _asking_priority = 0

        def _room(self, kind: str) -> float:
            room = super()._room(kind)
            if kind == LOWER and self.settings.reserved_slots and not (sheddable_keeps and self._asking_priority < 0):
                room += len(self.reserve.top_inflight)  # the per-engine rule's term taken back out
            return room

        def _has_room(self, priority: int) -> bool:
            self._asking_priority = priority
            return super()._has_room(priority)

        def _pump(self) -> None:
            nxt = self.queue.next_priority()
            self._asking_priority = -1 if nxt is not None and nxt < 0 else 0
            super()._pump()

    return Variant


@dataclass
class Outcome:
    delays: dict[str, list[float]] = field(default_factory=lambda: {o: [] for o in OBJECTIVES})
    ttft: dict[str, list[float]] = field(default_factory=lambda: {o: [] for o in OBJECTIVES})
    shed: dict[str, int] = field(default_factory=lambda: {o: 0 for o in OBJECTIVES})
    held: dict[str, list[float]] = field(default_factory=lambda: {o: [] for o in OBJECTIVES})  # admission's wait
    outcomes: dict[str, dict[str, int]] = field(default_factory=lambda: {o: {} for o in OBJECTIVES})
    sent: int = 0
    # the top band's holds by cause (loadaware/admission/top_holds.py)
    top_holds: dict[str, int] = field(default_factory=dict)
    live_floor: float | None = None  # the first sidecar's wait floor just before the traffic stops
    # (loadaware/admission/wait_floor.py), to set beside the point's own (wait_floor here)


async def run(point: Point, seed: int, rule: str, duration_s: float, replicas: int = 1) -> Outcome:
    loop = asyncio.get_running_loop()
    clock = loop.time
    decode_s = DECODE_MS * 2 / 1000  # the bench's --slower 2
    service_s = PREFILL_MS / 1000 + MAX_TOKENS * decode_s
    engines, slots = point.engines, point.slots
    fleet = {f"e{i}": Engine(f"e{i}", slots, decode_s) for i in range(engines)}
    controller_class, overrides = rule_setup(rule)
    settings = AdmissionSettings(max_held=MAX_HELD, max_held_bytes=MAX_HELD_BYTES, ttl_s=TTL_S, **overrides)
    objectives = Objectives({name: spec["priority"] for name, spec in OBJECTIVES.items()})
    sidecars: list[tuple[LoadTracker, AdmissionController]] = []  # the gateway's replicas, each its own sidecar
    for _ in range(replicas):
        tracker = LoadTracker(stale_s=STALE_S, clock=clock)
        for name in fleet:
            tracker.join(name)
        room = PoolRoom(tracker, lambda: fleet.keys(), lambda: (), queue=0)
        sidecars.append((tracker, controller_class(settings, objectives, room, clock=clock)))
    out = Outcome()
    rng = random.Random(seed * 1000 + round(point.load * 100))

    def scrape(name: str, tracker: LoadTracker, controller: AdmissionController) -> None:
        engine = fleet[name]
        seen = EngineStats(float(engine.running), float(len(engine.waiting)), None, at=clock())

        def arrive() -> None:
            stats = EngineStats(seen.running, seen.waiting, None, at=clock())
            tracker.record(name, stats)
            controller.on_scrape(name, stats)
        loop.call_later(SCRAPE_LAG_S, arrive)
        loop.call_later(SCRAPE_S, scrape, name, tracker, controller)

    for r, (tracker, controller) in enumerate(sidecars):  # each replica scrapes on its own schedule
        for i, name in enumerate(fleet):
            loop.call_later(SCRAPE_S * (i + r / replicas) / engines, scrape, name, tracker, controller)

    async def request(n: int, objective: str, tenant: str) -> None:
        tracker, controller = sidecars[n % replicas]  # the gateway spreads requests over its replicas
        arrived = clock()
        verdict: Verdict = await controller.admit(objective, tenant, BODY_BYTES, str(n))
        out.held[objective].append(clock() - arrived)
        counts = out.outcomes[objective]
        outcome = verdict.outcome + ("_late" if verdict.late else "")
        counts[outcome] = counts.get(outcome, 0) + 1
        if not verdict.admitted:
            out.shed[objective] += 1
            return
        has_room = controller.room_for(verdict)
        ordered = sorted(fleet, key=lambda ep: (tracker.load(ep, clock()), rng.random()))
        choice = next((ep for ep in ordered if has_room(ep)), ordered[0])
        decision = Decision(str(n), choice, "routed", (), 8, (), (), {}, 0.0)
        tracker.on_decided(decision)
        controller.settled(verdict, decision)
        started = loop.create_future()

        def start() -> None:
            out.delays[objective].append(clock() - arrived)
            loop.call_later(PREFILL_MS / 1000, lambda: out.ttft[objective].append(clock() - arrived))
            loop.call_later(service_s, end)

        def end() -> None:
            fleet[choice].finished()
            loop.call_later(HOP_S, heard)

        def heard() -> None:
            tracker.on_ended(decision)
            controller.on_ended(decision)
            started.set_result(None)

        loop.call_later(HOP_S, fleet[choice].submit, start)
        await started

    def read_floor() -> None:
        first = sidecars[0][1]
        out.live_floor = first.wait_floor.read(first.room.known_slots(), clock())["floor"]
    loop.call_later(duration_s * 0.99, read_floor)

    capacity = engines * slots / service_s
    rate = point.load * capacity
    mix = point.mix()
    weights = [w for _, _, w in mix]
    tasks = []
    t = rng.expovariate(rate)
    n = 0
    while t < duration_s:
        objective, tenant, _ = rng.choices(mix, weights)[0]
        await asyncio.sleep(max(0.0, t - clock()))
        tasks.append(asyncio.ensure_future(request(n, objective, tenant)))
        out.sent += 1
        n += 1
        t += rng.expovariate(rate)
    await asyncio.gather(*tasks)
    for _, controller in sidecars:
        for cause, n in controller.top_holds.by_cause.items():
            out.top_holds[cause] = out.top_holds.get(cause, 0) + n
    return out


def simulate(point: Point, seed: int, rule: str = "shipped", duration_s: float = 80.0, replicas: int = 1) -> Outcome:
    """One run in virtual time (deterministic for its arguments); `replicas` sidecars share the fleet, each
    deciding every `replicas`-th request and scraping every engine itself."""
    loop = VirtualLoop()
    try:
        return loop.run_until_complete(run(point, seed, rule, duration_s, replicas))
    finally:
        loop.close()


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ranked = sorted(values)
    return ranked[min(len(ranked) - 1, int(q * len(ranked)))]


def seeds_arg(text: str) -> list[int]:
    if "-" in text:
        a, b = text.split("-")
        return list(range(int(a), int(b) + 1))
    return [int(s) for s in text.split(",")]


@dataclass
class Tally:
    """One rule's runs, pooled: the critical band's delays, how many seeds (or points) held the target."""

    delays: list[float] = field(default_factory=list)
    within: int = 0
    runs: int = 0
    worst: float = 0.0
    standard_ttft: list[float] = field(default_factory=list)
    batch_served: int = 0
    batch_shed: int = 0
    standard_placed_ttl: int = 0  # the standard band's requests placed into full batches past their time to live
    misses: list[str] = field(default_factory=list)  # the runs past WITHIN_S: what, and their p95 delay

    def add(self, o: Outcome, label: str = "") -> None:
        self.delays += o.delays["critical"]
        p95 = pct(o.delays["critical"], .95)
        self.within += p95 <= WITHIN_S
        if p95 > WITHIN_S:
            self.misses.append(f"{label} {p95 * 1e3:.1f} ms")
        self.runs += 1
        self.worst = max(self.worst, p95)
        self.standard_ttft += o.ttft["standard"]
        self.batch_served += len(o.ttft["batch"])
        self.batch_shed += o.shed["batch"]
        self.standard_placed_ttl += o.outcomes["standard"].get("placed_ttl", 0)

    def row(self, label: str) -> str:
        d = self.delays
        return (f"| {label} | {pct(d, .5) * 1e3:.1f} / {pct(d, .95) * 1e3:.1f} / {pct(d, .99) * 1e3:.1f} | "
                f"{sum(x > 0.001 for x in d)} / {sum(x > 0.05 for x in d)} of {len(d)} | "
                f"**{self.within} of {self.runs}** ({self.worst * 1e3:.1f}) | {pct(self.standard_ttft, .95):.2f} | "
                f"{self.batch_served} / {self.batch_shed} | {self.standard_placed_ttl} |")


HEADER = ("| rule, load | critical delay p50 / p95 / p99 (ms) | delayed > 1 / > 50 ms | runs whose critical p95 "
          f"delay is within {WITHIN_S * 1e3:g} ms (the worst run's, ms) | standard TTFT p95 (s) | batch served / "
          "shed | standard placed past its time to live |\n|---|---|---|---|---|---|---|")


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m research.admission_des", description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=seeds_arg, default=seeds_arg("1-10"))
    p.add_argument("--loads", default="0.7,1.5", help="the bench's point at these loads (not with --draw)")
    p.add_argument("--draw", type=int, default=0,
                   help="instead: this many operating points drawn at random (draw_point), one run each, seeded "
                        "from --seeds' first")
    p.add_argument("--rules", default="shipped,per-engine,no-k,off")
    p.add_argument("--duration-s", type=float, default=80.0)
    p.add_argument("--replicas", type=int, default=1, help="sidecars sharing the fleet (a gateway's replicas)")
    p.add_argument("--holds", action="store_true",
                   help="at the bench's point, print each seed's top-band holds by cause and the standard band's "
                        "outcomes")
    args = p.parse_args()
    rules = args.rules.split(",")
    if args.draw:
        rng = random.Random(args.seeds[0])
        points = [(draw_point(rng), args.seeds[0] + i) for i in range(args.draw)]
        print(f"{args.draw} drawn points (seed {args.seeds[0]}), {args.duration_s:g} s a run, {args.replicas} "
              f"replica(s)\n\n{HEADER}")
        tallies = {rule: Tally() for rule in rules}
        by_floor = {rule: {False: [0, 0], True: [0, 0]} for rule in rules}  # floor >= 5%: [held, runs]
        for point, seed in points:
            for rule in rules:
                within = tallies[rule].within
                tallies[rule].add(simulate(point, seed, rule, args.duration_s, args.replicas),
                                  f"{point} seed {seed} (floor {wait_floor(point):.1%}):")
                cell = by_floor[rule][wait_floor(point) >= FLOOR_SHARE]
                cell[0] += tallies[rule].within - within
                cell[1] += 1
        for rule in rules:
            print(tallies[rule].row(rule))
        for rule in rules:
            (held_below, below), (held_above, above) = by_floor[rule][False], by_floor[rule][True]
            print(f"\n{rule}: within the target on {held_below} of {below} points whose wait floor is under "
                  f"{FLOOR_SHARE:.0%}, {held_above} of {above} at or above it")
        for rule in rules:
            print(f"\n{rule} missed on:" if tallies[rule].misses else f"\n{rule} missed on none", *tallies[rule].misses,
                  sep="\n- ")
        return
    print(f"the bench's point ({BENCH_POINT}), {args.duration_s:g} s a run, {args.replicas} replica(s), seeds "
          f"{args.seeds[0]}..{args.seeds[-1]}\n\n{HEADER}")
    for rule in rules:
        for load in (float(x) for x in args.loads.split(",")):
            tally = Tally()
            for seed in args.seeds:
                o = simulate(BENCH_POINT.at(load), seed, rule, args.duration_s, args.replicas)
                tally.add(o)
                if args.holds:
                    live = "-" if o.live_floor is None else f"{o.live_floor:.1%}"
                    print(f"seed {seed}: critical p95 delay {pct(o.delays['critical'], .95) * 1e3:.1f} ms, top-band "
                          f"holds {o.top_holds}, standard {o.outcomes['standard']}, wait floor "
                          f"{wait_floor(BENCH_POINT.at(load)):.1%} (the sidecar's own, read as the traffic ends: "
                          f"{live})")
            print(tally.row(f"{rule}, {load:g}x"))


if __name__ == "__main__":
    main()
