"""Why the sidecar routed a request where it did, from its own record of the decision (/debug/decisions),
worked in the formula of the policy that decided (the record names it):

    loadaware:   score(i) = min(1, matched(i) / prompt) - beta * (load(i) - mean_load) / max(1, mean_load)
    cost policies (lane-spread): score(i) = -cost(i), the predicted time to first token weighed by the batch
    it joins (docs/policies.md); lowest cost wins
    banded: lane-spread's cost, only among the engines whose loadaware score (beta 1) is within
    BAND of the best; the table shows that score beside the cost
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from loadaware.policies.banded import BAND
from loadaware.policies.bounded import PRICED_OUT

EngineName = Callable[[str | None], str]  # endpoint ip:port -> engine name
SCORE_POLICY = "loadaware"  # the one policy explained by its score; the others by their cost
BANDED = "banded"  # a cost policy inside loadaware's band: its table shows both


def explain(d: dict[str, Any], served_by: str, status: int, name: EngineName, beta: float) -> None:
    """Print decision `d` as a per-engine table and one line on why the chosen engine won."""
    print(f"   -> {served_by} (HTTP {status}; sidecar chose {name(d['endpoint'])}, policy {d.get('policy')}, "
          f"outcome {d['outcome']}, decided in {d['total_ms']:.2f} ms)", flush=True)
    if d.get("policy") == SCORE_POLICY:
        _score_table(d, name, beta)
    else:
        _cost_table(d, name)


def _score_table(d: dict[str, Any], name: EngineName, beta: float) -> None:
    cands = d["candidates"]
    prompt = int(d["prompt_tokens"])
    loads = [float(c["load"]) for c in cands]
    mean = sum(loads) / len(loads) if loads else 0.0
    scale = max(1.0, mean)
    print(f"      {'engine':<10} {'endpoint':<15} {'matched/prompt':>15} {'benefit':>8} {'load':>6} "
          f"{'rel.load':>9} {'score':>7}", flush=True)
    for c in cands:
        benefit = min(1.0, c["matched_tokens"] / prompt) if prompt else 0.0
        rel = (float(c["load"]) - mean) / scale
        print(f"      {name(c['endpoint']):<10} {c['endpoint']:<15} "
              f"{c['matched_tokens']:>7}/{prompt:<7} {benefit:>8.3f} {float(c['load']):>6.1f} "
              f"{rel:>+9.3f} {float(c['score']):>+7.3f}{_mark(d, c)}", flush=True)
    print(f"      why: {why(d, mean, name, beta)}", flush=True)


def _cost_table(d: dict[str, Any], name: EngineName) -> None:
    prompt = int(d["prompt_tokens"])
    banded = d.get("policy") == BANDED
    la = loadaware_scores(d) if banded else {}
    print(f"      {'engine':<10} {'endpoint':<15} {'matched/prompt':>15} {'load':>6} {'decode':>7} {'waiting':>8} "
          f"{'clock (s)':>9} {'cost (s)':>9}" + (f" {'la score':>9}" if banded else ""), flush=True)
    for c in d["candidates"]:
        cost, out = cost_of(c)
        note = (" out of band" if banded else " priced out") if out else ""
        band = f" {la[c['endpoint']]:>+9.3f}" if banded else ""
        print(f"      {name(c['endpoint']):<10} {c['endpoint']:<15} {c['matched_tokens']:>7}/{prompt:<7} "
              f"{float(c['load']):>6.1f} {float(c.get('decode_batch', 0)):>7.1f} {float(c.get('waiting', 0)):>8.1f} "
              f"{float(c.get('lane_wait_s', 0)):>9.3f} {cost:>9.3f}{band}{note}{_mark(d, c)}", flush=True)
    print(f"      why: {why_cost(d, name)}", flush=True)


def loadaware_scores(d: dict[str, Any]) -> dict[str, float]:
    """The seed's loadaware score (beta 1) of each candidate of decision d: banded's band is within BAND of the
    best (loadaware/policies/banded.py). The decision's own mean load when it was pruned, else its candidates'."""
    cands = d["candidates"]
    prompt = int(d["prompt_tokens"])
    loads = [float(c["load"]) for c in cands]
    mean = d.get("mean_load")
    mean = float(mean) if mean is not None else (sum(loads) / len(loads) if loads else 0.0)
    scale = max(1.0, mean)
    return {c["endpoint"]: (min(1.0, c["matched_tokens"] / prompt) if prompt > 0 else 0.0) - (load - mean) / scale
            for c, load in zip(cands, loads)}


def cost_of(c: dict[str, Any]) -> tuple[float, bool]:
    """(a cost policy's cost of candidate c, whether the pile-up guard priced it out: its score carries
    PRICED_OUT, loadaware/policies/bounded.py)."""
    cost = -float(c["score"])
    return (cost - PRICED_OUT, True) if cost >= PRICED_OUT else (cost, False)


def _mark(d: dict[str, Any], c: dict[str, Any]) -> str:
    return "  <= chosen" if c["endpoint"] == d["endpoint"] else ""


Row = dict[str, Any]


def _routed(d: dict[str, Any]) -> tuple[list[Row], int, Row, Row] | str:
    """(candidates, prompt tokens, the chosen one, the longest match) of a routed decision; else why not."""
    if d["outcome"] != "routed":
        return f"fallback ({', '.join(d['reasons'])}): load term only"
    cands = d["candidates"]
    chosen = next(c for c in cands if c["endpoint"] == d["endpoint"])
    return cands, int(d["prompt_tokens"]), chosen, max(cands, key=lambda c: c["matched_tokens"])


def _all_tie(cands: list[Row]) -> bool:
    return len({round(float(c["score"]), 9) for c in cands}) == 1


def why_cost(d: dict[str, Any], name: EngineName) -> str:
    """A cost policy's decision in one line: the lowest predicted cost, and what the prefix holder would cost."""
    parts = _routed(d)
    if isinstance(parts, str):
        return parts
    cands, prompt, chosen, best_match = parts
    cost, _ = cost_of(chosen)
    if best_match["matched_tokens"] == 0:
        if _all_tie(cands):
            return (f"no engine holds any of the {prompt} tokens and every cost ties at {cost:.3f} s; the tie-break "
                    f"(longer match, lower load, then endpoint) picks {name(chosen['endpoint'])}")
        return f"no prefix anywhere: the lowest predicted cost wins ({name(chosen['endpoint'])}, {cost:.3f} s)"
    if best_match["endpoint"] == chosen["endpoint"]:
        return (f"{name(chosen['endpoint'])} holds {chosen['matched_tokens']}/{prompt} tokens: only the rest is "
                f"prefilled there, the lowest predicted cost ({cost:.3f} s)")
    held, out = cost_of(best_match)
    holder = (f"holder {name(best_match['endpoint'])} ({best_match['matched_tokens']}/{prompt} tokens, decode batch "
              f"{float(best_match.get('decode_batch', 0)):g}, load {float(best_match['load']):g})")
    if out and d.get("policy") == BANDED:
        return (f"{holder} is busy enough that loadaware (beta 1) scores it more than {BAND:g} below its own "
                f"choice, outside the band (its own cost {held:.3f} s); {name(chosen['endpoint'])} costs {cost:.3f} s "
                "-> load outweighs the cached prefix")
    if out:
        return (f"{holder} carries more than half of the pool's load, so the pile-up guard priced it out (its own "
                f"cost {held:.3f} s); {name(chosen['endpoint'])} costs {cost:.3f} s -> load outweighs the cached "
                "prefix")
    return (f"{holder} costs {held:.3f} s, more than prefilling the whole prompt on {name(chosen['endpoint'])} "
            f"({cost:.3f} s) -> load outweighs the cached prefix")


def why(d: dict[str, Any], mean: float, name: EngineName, beta: float) -> str:
    """loadaware's score formula of the decision, worked for the engines that matter."""
    if d.get("rule") == "state":
        return (f"it names a stored response that {name(d['endpoint'])} holds (found {d.get('state')}): state beats "
                f"load, whatever the scores say")
    parts = _routed(d)
    if isinstance(parts, str):
        return parts
    cands, prompt, chosen, best_match = parts
    scale = max(1.0, mean)
    if best_match["matched_tokens"] == 0:
        if _all_tie(cands):
            return (f"no engine holds any of the {prompt} tokens and loads are equal: every score ties at "
                    f"{float(chosen['score']):+.3f}; the tie-break (longer match, lower load, then endpoint) "
                    f"picks {name(chosen['endpoint'])}")
        return f"no prefix anywhere: the least loaded engine wins ({float(chosen['score']):+.3f})"
    if best_match["endpoint"] == chosen["endpoint"]:
        return (f"{name(chosen['endpoint'])} holds {chosen['matched_tokens']}/{prompt} tokens "
                f"(benefit {min(1.0, chosen['matched_tokens'] / prompt):.3f}) at load "
                f"{float(chosen['load']):g} vs fleet mean {mean:.2f}: highest score "
                f"{float(chosen['score']):+.3f}")
    b = min(1.0, best_match["matched_tokens"] / prompt)
    rel_h = (float(best_match["load"]) - mean) / scale
    bc = min(1.0, chosen["matched_tokens"] / prompt)
    return (f"holder {name(best_match['endpoint'])}: {b:.3f} - {beta:g}*({float(best_match['load']):g}"
            f"-{mean:.2f})/{scale:.2f} = {b:.3f} - {beta * rel_h:.3f} = {float(best_match['score']):+.3f}; "
            f"{name(chosen['endpoint'])}: {bc:.3f} - {beta:g}*({float(chosen['load']):g}-{mean:.2f})"
            f"/{scale:.2f} = {float(chosen['score']):+.3f} -> load outweighs the cached prefix")
