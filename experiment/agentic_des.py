"""The agentic workload in the DES: seeds x configurations x arms, every arm through the sidecar's pipeline.

    python -m experiment.agentic --seeds 3 [--role both|design|held-out] [--configs lmcache,kv-events]
        [--arms auto,loadaware,loadaware-stateless,<peers>] [--jobs 2] [--doc docs/results.md]

Seeds: `design` seeds 1.. (what the workload's parameters were set on), `held-out` seeds 101.. (looked at only
for the report), kept apart as experiment.scenarios keeps them. Fleet: 4 engines of the calibrated service model
(experiment.calibration), the sidecar's default scrape interval, BUFFERED (no first chunks seen).

Configurations (the prefix source): `lmcache`: stock LMCache (one holder per chunk). There `auto` is the sidecar
as its README runs it (`--policy auto`, LMCache and its own record of where it sent each prefix) and `loadaware`
is `--policy loadaware --prefix-source lmcache` (LMCache alone), as the real-time arms `default` and
`loadaware-b1.0` are. `kv-events`: every engine's GPU prefix cache; there both arms read the same source.
`loadaware-stateless` is the sidecar with no state routing (an ablation: what the holder rule buys). Peers:
experiment.peers' arms, which have no state routing.

Per arm: TTFT p50/p95 of every turn (from its first send to its first token, through a re-send after a miss),
the share of Responses follow-ups placed on their state's holder (the others failed with a 404 and were re-sent
with the whole history), the GPU prefix hit rate, and the makespan. Medians over seeds.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from experiment.agentic import AgenticSpec, build
from experiment.agentic_sim import (
    STATELESS_SUFFIX,
    AgenticOutcome,
    hit_rate,
    prepare_turns,
    simulate_agentic,
    ttfts,
)
from experiment.arms import Arm, arm_by_name
from experiment.calibration import CALIBRATED
from experiment.config_grid import SCRAPE_INTERVAL_S
from experiment.des import FleetConfig
from experiment.grid_blocks import PEERS
from experiment.report import invoked_as, replace_section
from loadaware.policies.auto import AUTO, auto_policy

START, END = "<!-- agentic:start -->", "<!-- agentic:end -->"
ROLES = {"design": 1, "held-out": 101}  # first workload seed of each role
ENGINES = 4
CONFIGS = ("lmcache", "kv-events")
SIDECAR = (AUTO, "loadaware", "loadaware" + STATELESS_SUFFIX)
DEFAULT_ARMS = (*SIDECAR, *PEERS)


@dataclass(frozen=True)
class AgenticRow:
    config: str
    arm: str
    seed: int
    ttft_p50: float
    ttft_p95: float
    follow_ups: int
    reached: int
    state_placed: int
    hit_rate: float
    makespan_s: float
    chat_moved: float  # chat follow-ups served by another engine than their previous turn
    chat_ttft_p95: float  # TTFT p95 of chat follow-ups (the re-sent history)

    @property
    def reached_share(self) -> float:
        return self.reached / self.follow_ups if self.follow_ups else 1.0


def fleet_of(config: str, arm: str) -> FleetConfig:
    """The fleet and sidecar deployment of one arm in one configuration (module docstring)."""
    base = FleetConfig(engines=ENGINES, service=CALIBRATED, response_seen=False,
                       router_scrape_interval_s=SCRAPE_INTERVAL_S)
    if config == "kv-events":
        return replace(base, credit="gpu")
    if config == "lmcache":
        return replace(base, credit="single", approx_beside=arm == AUTO)
    raise ValueError(f"unknown configuration {config!r}; known: {', '.join(CONFIGS)}")


def arm_of(name: str) -> Arm:
    if name == AUTO:
        return replace(arm_by_name(auto_policy(True)[0]), name=AUTO)
    if name.endswith(STATELESS_SUFFIX):
        return replace(arm_by_name(name.removesuffix(STATELESS_SUFFIX)), name=name)
    return arm_by_name(name)


def run_seed(args: tuple[AgenticSpec, int, Sequence[str], Sequence[str]]) -> list[AgenticRow]:
    """Every configuration and arm on one seed's sessions (prepared once)."""
    spec, seed, configs, arms = args
    prepared = prepare_turns(build(spec, seed))
    rows = []
    for config in configs:
        for name in arms:
            out = simulate_agentic(prepared, arm_of(name), fleet_of(config, name), seed)
            x = ttfts(out)
            ends = [r.end_t for r in out.run.requests if r.end_t is not None]
            moved, chat = _chat_follow_ups(out)
            rows.append(AgenticRow(config, name, seed, float(np.percentile(x, 50)), float(np.percentile(x, 95)),
                                   out.follow_ups, out.reached, out.state_placed, hit_rate(out),
                                   max(ends, default=0.0), moved, float(np.percentile(chat, 95)) if chat else 0.0))
    return rows


def _chat_follow_ups(out: AgenticOutcome) -> tuple[float, list[float]]:
    """(the share of chat follow-ups served away from their previous turn's engine, their TTFTs)."""
    reqs = out.run.requests
    follow = [t for t in out.turns if t.api == "chat" and t.previous is not None]
    moved = sum(reqs[t.index].engine != reqs[t.previous].engine for t in follow if t.previous is not None)
    return moved / max(1, len(follow)), ttfts(out, follow)


def run(spec: AgenticSpec, seeds: Sequence[int], configs: Sequence[str], arms: Sequence[str], jobs: int
        ) -> list[AgenticRow]:
    tasks = [(spec, s, tuple(configs), tuple(arms)) for s in seeds]
    if jobs <= 1:
        return [r for t in tasks for r in run_seed(t)]
    with ProcessPoolExecutor(jobs) as pool:
        return [r for rows in pool.map(run_seed, tasks) for r in rows]


def _median(rows: Sequence[AgenticRow], attr: str) -> float:
    return float(np.median([getattr(r, attr) for r in rows]))


def table(rows: Sequence[AgenticRow], config: str, arms: Sequence[str]) -> list[str]:
    lines = ["| arm | TTFT p50 s | TTFT p95 s | Responses follow-ups reaching state | placed by the state rule | "
             "chat follow-ups moved | chat follow-up TTFT p95 s | prefix hit | makespan s |",
             "|---|---|---|---|---|---|---|---|---|"]
    for arm in arms:
        mine = [r for r in rows if r.config == config and r.arm == arm]
        if not mine:
            continue
        reached, total = sum(r.reached for r in mine), sum(r.follow_ups for r in mine)
        placed = sum(r.state_placed for r in mine)
        lines.append(f"| {arm} | {_median(mine, 'ttft_p50'):.3f} | {_median(mine, 'ttft_p95'):.3f} | "
                     f"{reached / max(1, total):.1%} ({reached}/{total}) | {placed / max(1, total):.1%} | "
                     f"{_median(mine, 'chat_moved'):.0%} | {_median(mine, 'chat_ttft_p95'):.3f} | "
                     f"{_median(mine, 'hit_rate'):.3f} | {_median(mine, 'makespan_s'):.0f} |")
    return lines


def section(results: dict[str, list[AgenticRow]], spec: AgenticSpec, arms: Sequence[str], command: str,
            wall_s: float) -> str:
    some = next(iter(results.values()))
    seed0 = some[0].seed if some else 1
    d = build(spec, seed0).describe()
    out = [START, "## Agentic sessions (DES)", "",
           f"`{command}` ({wall_s:.0f} s). Workload (experiment/agentic.py, defaults): {spec.root_sessions} root "
           f"agent sessions per seed at {spec.session_rate:g}/s, {spec.turns[0]}-{spec.turns[1]} turns each, context "
           f"re-sent and growing every turn (tool outputs {spec.tool_tokens[0]}-{spec.tool_tokens[1]} tokens, "
           f"pauses {spec.pause_s[0]:g}-{spec.pause_s[1]:g} s), sub-agents (fan-out {spec.fanout[0]}-"
           f"{spec.fanout[1]} at {spec.fanout_prob:.0%} of turns) sharing the parent's system prompt "
           f"({spec.n_systems} prompts of {spec.system_tokens[0]}-{spec.system_tokens[1]} tokens), "
           f"{spec.responses_share:.0%} of root sessions on the Responses API with `previous_response_id`. "
           f"Seed {seed0}: {d['turns']} turns in {d['sessions']} sessions, {d['stateful_follow_ups']} stateful "
           f"follow-ups, prompts {d['prompt_tokens_mean']:.0f} tokens on average (max {d['prompt_tokens_max']}). "
           f"Fleet: {ENGINES} calibrated engines, BUFFERED. A follow-up off its holder fails (404) and is re-sent "
           "with the whole history; TTFT counts from the turn's first send. Medians over seeds; state shares "
           "pooled over seeds. `chat follow-ups moved`: chat turns served by another engine than their session's "
           "previous turn (each prefills the re-sent history again there, a cost no state rule prevents: "
           "compare the chat follow-ups' TTFT p95).", ""]
    for role, rows in results.items():
        seeds = sorted({r.seed for r in rows})
        for config in dict.fromkeys(r.config for r in rows):
            out += [f"**{role}** seeds {seeds[0]}-{seeds[-1]}, prefix source `{config}`:", "",
                    *table(rows, config, arms), ""]
    out.append(END)
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m experiment.agentic", description=__doc__.split("\n")[0])
    p.add_argument("--seeds", type=int, default=3, help="seeds per role")
    p.add_argument("--role", choices=("both", "design", "held-out"), default="both")
    p.add_argument("--configs", default=",".join(CONFIGS))
    p.add_argument("--arms", default=",".join(DEFAULT_ARMS))
    p.add_argument("--sessions", type=int, default=None, help="root sessions per seed (default: the spec's)")
    p.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1))
    p.add_argument("--doc", type=Path, default=None, help="write the section into this Markdown file")
    args = p.parse_args(argv)
    spec = AgenticSpec() if args.sessions is None else AgenticSpec(root_sessions=args.sessions)
    arms, configs = args.arms.split(","), args.configs.split(",")
    roles = ("design", "held-out") if args.role == "both" else (args.role,)
    t0 = time.monotonic()
    results = {role: run(spec, range(ROLES[role], ROLES[role] + args.seeds), configs, arms, args.jobs)
               for role in roles}
    command = invoked_as("python -m experiment.agentic") + " " + " ".join(
        argv if argv is not None else sys.argv[1:])
    text = section(results, spec, arms, command.strip(), time.monotonic() - t0)
    print(text)
    if args.doc is not None:
        replace_section(args.doc, START, END, text)
    return 0
