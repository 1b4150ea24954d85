"""Why the sidecar routed a request where it did, from its own record of the decision (/debug/decisions):

    score(i) = min(1, matched(i) / prompt) - beta * (load(i) - mean_load) / max(1, mean_load)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

EngineName = Callable[[str | None], str]  # endpoint ip:port -> engine name


def explain(d: dict[str, Any], served_by: str, status: int, name: EngineName, beta: float) -> None:
    """Print decision `d` as a per-engine table (matched/prompt, benefit, load, relative load, score) and
    one line on why the chosen engine won."""
    cands = d["candidates"]
    prompt = int(d["prompt_tokens"])
    loads = [float(c["load"]) for c in cands]
    mean = sum(loads) / len(loads) if loads else 0.0
    scale = max(1.0, mean)
    print(f"   -> {served_by} (HTTP {status}; sidecar chose {name(d['endpoint'])}, "
          f"outcome {d['outcome']}, decided in {d['total_ms']:.2f} ms)", flush=True)
    print(f"      {'engine':<10} {'endpoint':<15} {'matched/prompt':>15} {'benefit':>8} {'load':>6} "
          f"{'rel.load':>9} {'score':>7}", flush=True)
    for c in cands:
        benefit = min(1.0, c["matched_tokens"] / prompt) if prompt else 0.0
        rel = (float(c["load"]) - mean) / scale
        mark = "  <= chosen" if c["endpoint"] == d["endpoint"] else ""
        print(f"      {name(c['endpoint']):<10} {c['endpoint']:<15} "
              f"{c['matched_tokens']:>7}/{prompt:<7} {benefit:>8.3f} {float(c['load']):>6.1f} "
              f"{rel:>+9.3f} {float(c['score']):>+7.3f}{mark}", flush=True)
    print(f"      why: {why(d, mean, name, beta)}", flush=True)


def why(d: dict[str, Any], mean: float, name: EngineName, beta: float) -> str:
    """The score formula of the decision, worked for the engines that matter."""
    cands = d["candidates"]
    prompt = int(d["prompt_tokens"])
    if d["outcome"] != "routed":
        return f"fallback ({', '.join(d['reasons'])}): load term only"
    chosen = next(c for c in cands if c["endpoint"] == d["endpoint"])
    best_match = max(cands, key=lambda c: c["matched_tokens"])
    scale = max(1.0, mean)
    if best_match["matched_tokens"] == 0:
        if len({round(float(c["score"]), 9) for c in cands}) == 1:
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

