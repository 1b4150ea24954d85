"""Recorded request streams, replayed through the sidecar's decision core: the differential test's rig.

A stream is what the decision core hears from the outside, in order: requests to decide (the prompt as a
spec of shared segments, the model, the session key, the proxy's subset hint, a stored response's id, and
what an exact prefix source answers for it), engine scrapes, the response path's first chunks, the proxy's
retries and statuses, request ends, learned response holders, and the clock moving. Replaying one yields
every decision the core made: the ranked endpoints, the outcome, the reasons, the rule, affinity and state,
and a digest of every candidate with its score.

The streams cover the configurations the sidecar ships (prefix source exact / approximate / both / none,
tokens or text, BUFFERED or picker: first chunks seen or not, a cold start warming up) for every policy, a
fleet large enough for the pruned, floored and round-robin shortcuts (routing/pruning.py), and a saturated
fleet where every engine queues (admission's case: the policies' all-queueing rules). Sessions, a second
model, failing engines and stored responses run through all of them.

`python -m testkit.decision_replay --record` writes the streams and their decisions to tests/fixtures/decisions/
(run it on the code whose decisions are the reference); tests/unit/test_decision_differential.py replays them
through the current code and asks that every decision be equal.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import hashlib
import json
import random
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from loadaware.config import Settings
from loadaware.lifecycle import Decision
from loadaware.policies import POLICY_NAMES
from loadaware.policies.base import Candidate
from loadaware.routing.request import InferenceRequest
from testkit.decision_core import SimClock, build_replayed

FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "decisions"
SOURCES = ("exact", "approx", "exact+approx", "none")
OTHER_MODEL = "other-model"
MODEL = "model-a"
SEGMENT_TOKENS = (64, 256, 1024)
# The fields of a candidate the digest covers: those the base code knew (a later field is new information).
CANDIDATE_FIELDS = tuple(f.name for f in fields(Candidate) if f.name != "scraped")

Event = list[Any]


@dataclass(frozen=True)
class StreamConfig:
    policy: str
    source: str  # exact | approx | exact+approx | none
    tokens: bool  # the prompt arrives as token ids (a tokenizer ran); False: as text
    picker: bool  # the response path shows first chunks and the proxy sends subset hints
    endpoints: int = 6
    saturated: bool = False  # every engine queues (scraped waiting > 0)
    decisions: int = 100
    seed: int = 0

    @property
    def name(self) -> str:
        mode = "picker" if self.picker else "buffered"
        return (f"{self.policy}/{self.source}/{'tokens' if self.tokens else 'text'}/{mode}/"
                f"{self.endpoints}{'/saturated' if self.saturated else ''}/s{self.seed}")


def grid() -> dict[str, list[StreamConfig]]:
    """The recorded groups: every policy in every shipped configuration on a small fleet; a large fleet; a
    saturated one."""
    small = [StreamConfig(p, s, t, m, seed=i) for i, (p, s, t, m) in enumerate(
        (p, s, t, m) for p in POLICY_NAMES for s in SOURCES for t in (True, False) for m in (False, True))]
    large = [StreamConfig(p, s, True, m, endpoints=96, decisions=60, seed=1000 + i) for i, (p, s, m) in enumerate(
        (p, s, m) for p in POLICY_NAMES for s in ("exact", "approx") for m in (False, True))]
    saturated = [StreamConfig(p, "exact", True, False, saturated=True, seed=2000 + i)
                 for i, p in enumerate(POLICY_NAMES)]
    return {"small": small, "large": large, "saturated": saturated}


# ---- the streams ----------------------------------------------------------------------------------------------
def endpoint_names(n: int) -> list[str]:
    return [f"10.0.{i // 250}.{i % 250 + 1}:8000" for i in range(n)]


def segment_tokens(segment: int, length: int) -> list[int]:
    """A segment's token ids: the same segment is the same tokens in every prompt (a shared prefix)."""
    return [(segment * 7919 + i * 31) % 50_000 + 1 for i in range(length)]


def prompt_of(spec: list[list[int]], tokens: bool) -> list[int] | str:
    ids = [t for segment, length in spec for t in segment_tokens(segment, length)]
    return ids if tokens else " ".join(f"w{t}" for t in ids)


def generate(config: StreamConfig) -> list[Event]:
    rng = random.Random(config.seed)
    eps = endpoint_names(config.endpoints)
    events: list[Event] = [["model", ep, OTHER_MODEL if i == len(eps) - 1 else MODEL] for i, ep in enumerate(eps)]
    open_decisions: list[int] = []
    learned = 0
    for k in range(config.decisions):
        events.append(["tick", round(rng.uniform(0.0, 0.4), 3)])
        for ep in rng.sample(eps, k=min(len(eps), rng.randint(0, 3))):
            events.append(scrape_event(rng, ep, config.saturated or rng.random() < 0.15))
        events.append(decide_event(rng, eps, config, k, learned))
        open_decisions.append(k)
        events.extend(progress_events(rng, eps, config, open_decisions))
        if rng.random() < 0.1:
            events.append(["learn", f"resp_{learned}", rng.choice(eps)])
            learned += 1
        if rng.random() < 0.05:
            events.append(["preview", decide_event(rng, eps, config, k, learned)[1]])
        if rng.random() < 0.03:  # an engine leaves and comes back (a rollout): the fleet's order changes
            ep = rng.choice(eps[1:])
            events.extend((["leave", ep], ["tick", 0.5], ["join", ep]))
    return events


def scrape_event(rng: random.Random, ep: str, queueing: bool) -> Event:
    running = rng.randint(0, 12)
    waiting = rng.randint(1, 6) if queueing else 0
    count = rng.randint(0, 200)
    return ["scrape", ep, running, waiting, round(rng.uniform(0.0, 0.95), 3),
            round(count * rng.uniform(0.05, 0.4), 3), count, rng.choice((None, 64_000.0, 128_000.0))]


def decide_event(rng: random.Random, eps: list[str], config: StreamConfig, k: int, learned: int) -> Event:
    spec = [[rng.randint(0, 3), rng.choice(SEGMENT_TOKENS)], [100 + rng.randint(0, 15), rng.choice(SEGMENT_TOKENS)],
            [10_000 + k, rng.randint(5, 300)]]
    if rng.random() < 0.2:
        spec = spec[1:]
    request: dict[str, Any] = {
        "prompt": spec, "model": OTHER_MODEL if rng.random() < 0.05 else rng.choice((MODEL, MODEL, None)),
        "session": f"s{rng.randint(0, 9)}" if rng.random() < 0.4 else "",
        "subset": sorted(rng.sample(eps, k=max(1, len(eps) * 2 // 3))) if config.picker and rng.random() < 0.3
        else None,
        "state": f"resp_{rng.randint(0, learned)}" if learned and rng.random() < 0.1 else None,
        "salt": "tenant-b" if rng.random() < 0.1 else None,
    }
    total = sum(length for _, length in spec)
    answer = {ep: min(total, rng.choice((0, 64, 256, 512, 1024, 2048))) for ep in rng.sample(eps, k=min(3, len(eps)))}
    return ["decide", request, {ep: n for ep, n in answer.items() if n}]


def progress_events(rng: random.Random, eps: list[str], config: StreamConfig, open_decisions: list[int]
                    ) -> list[Event]:
    out: list[Event] = []
    for k in list(open_decisions):
        r = rng.random()
        if config.picker and r < 0.3:
            out.append(["first_chunk", k])
        if r < 0.05:
            out.append(["served", k, rng.choice(eps)])
        if r < 0.35:
            # The first two engines fail most of their requests (ejected for a while), the rest now and then.
            flaky = 503 if rng.random() < 0.7 else 200
            other = 503 if rng.random() < 0.03 else 200
            out.extend((["responded", k, flaky, other, eps[:2]], ["ended", k]))
            open_decisions.remove(k)
    return out


# ---- the replay -----------------------------------------------------------------------------------------------
def record_of(decision: Decision) -> dict[str, Any]:
    digest = hashlib.sha256(repr([tuple(getattr(c, f) for f in CANDIDATE_FIELDS) for c in decision.candidates]
                                 + list(decision.scores)).encode()).hexdigest()[:20]
    return {"endpoint": decision.endpoint, "ranked": list(decision.ranked), "outcome": decision.outcome,
            "reasons": list(decision.reasons), "rule": decision.rule, "policy": decision.policy,
            "prompt_tokens": decision.prompt_tokens, "pool_size": decision.pool_size,
            "mean_load": decision.mean_load, "affinity": decision.affinity, "state": decision.state,
            "candidates": len(decision.candidates), "top_scores": sorted(decision.scores, reverse=True)[:3],
            "digest": digest}


async def replay(config: StreamConfig, events: list[Event]) -> list[dict[str, Any]]:
    """Every decision the current code makes on the stream, as `record_of` describes it."""
    clock = SimClock()
    core = build_replayed(config.policy, config.source, endpoint_names(config.endpoints), clock,
                      Settings(session_header="x-session-id"), text_encoder=not config.tokens)
    decisions: list[Decision] = []
    for event in events:
        await apply(core, clock, config, event, decisions)
    return [record_of(d) for d in decisions]


async def apply(core: Any, clock: SimClock, config: StreamConfig, event: Event, decisions: list[Decision]) -> None:
    kind = event[0]
    if kind == "tick":
        clock.now += event[1]
    elif kind == "model":
        core.serve_models(event[1], {event[2]})
    elif kind == "scrape":
        core.scraped(event[1], *event[2:])
    elif kind == "decide":
        request, answer = event[1], event[2]
        core.exact.answer = answer
        decisions.append(await core.decider.decide(
            inference_request(request, config.tokens), f"r{len(decisions)}",
            subset=frozenset(request["subset"]) if request["subset"] is not None else None,
            session=request["session"]))
    elif kind == "preview":
        request = event[1]
        await core.decider.decide(inference_request(request, config.tokens), "preview", count=False,
                                  subset=frozenset(request["subset"]) if request["subset"] is not None else None,
                                  session=request["session"])
    elif kind == "learn":
        core.state.learn(event[1], event[2])
    elif kind == "leave":
        core.leave(event[1])
    elif kind == "join":
        core.join(event[1])
    else:
        decision = decisions[event[1]]
        if decision.endpoint is not None:
            lifecycle_event(core.lifecycle, kind, decision, event)


def lifecycle_event(lifecycle: Any, kind: str, decision: Decision, event: Event) -> None:
    if kind == "first_chunk":
        lifecycle.first_chunk(decision)
    elif kind == "served":
        lifecycle.served(decision, event[2])
    elif kind == "responded":
        lifecycle.responded(decision, event[2] if decision.served in event[4] else event[3], decision.served)
    elif kind == "ended":
        lifecycle.ended(decision)
    else:
        raise ValueError(f"unknown event {kind!r}")


def inference_request(request: dict[str, Any], tokens: bool) -> InferenceRequest:
    kind = "responses" if request["state"] is not None else "completions"
    return InferenceRequest(kind, prompt=prompt_of(request["prompt"], tokens), model=request["model"],
                            cache_salt=request["salt"], state_id=request["state"])


# ---- the recording --------------------------------------------------------------------------------------------
def fixture_path(group: str) -> Path:
    return FIXTURES / f"{group}.json.gz"


def load_group(group: str) -> list[dict[str, Any]]:
    with gzip.open(fixture_path(group), "rt") as f:
        streams: list[dict[str, Any]] = json.load(f)
    return streams


def config_of(stream: dict[str, Any]) -> StreamConfig:
    return StreamConfig(**stream["config"])


async def record(groups: dict[str, list[StreamConfig]]) -> None:
    FIXTURES.mkdir(parents=True, exist_ok=True)
    for group, configs in groups.items():
        streams = []
        for config in configs:
            events = generate(config)
            streams.append({"config": asdict(config), "events": events, "decisions": await replay(config, events)})
        with gzip.open(fixture_path(group), "wt", compresslevel=9) as f:
            json.dump(streams, f, separators=(",", ":"))
        print(f"{group}: {len(streams)} streams, {sum(len(s['decisions']) for s in streams)} decisions "
              f"-> {fixture_path(group)} ({fixture_path(group).stat().st_size / 1e3:.0f} kB)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--record", action="store_true", help="write the streams and the current decisions")
    args = parser.parse_args()
    if not args.record:
        parser.error("nothing to do: --record writes the reference (the test replays it)")
    asyncio.run(record(grid()))


if __name__ == "__main__":
    main()
