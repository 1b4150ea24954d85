"""The arms of the real-time experiment: which router decides, with which settings.

Sidecar arms go through Envoy + the loadaware sidecar (`--policy`, `--loadaware-beta`, `--prefix-source`);
peer arms send straight to a peer router (sglang-router, vllm-router) in front of the same engines. Names
follow the DES (`experiment.des`) and the reference's cells, so per-seed rows of both modes line up; the
KV-events arms carry a `-kvev` suffix because the same policy with a different prefix source is a
different arm (stock LMCache credits one holder per chunk, KV events credit every holder: see
docs/architecture.md, "Data sources").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from loadaware.policies import POLICY_NAMES

Kind = Literal["sidecar", "peer"]
PrefixSource = Literal["lmcache", "kv-events", "default"]  # default: no --prefix-source (LMCache and the record)
Peer = Literal["sglang-router", "vllm-router"]


@dataclass(frozen=True)
class RealArm:
    name: str
    kind: Kind
    policy: str = ""  # sidecar policy, or the peer's --policy
    beta: float = 1.0
    prefix_source: PrefixSource = "lmcache"
    peer: Peer | None = None

    @property
    def credit(self) -> str:
        """How the arm's prefix source credits holders, in the DES's terms ("single" | "gpu" | ""): stock
        LMCache one holder per chunk, KV events every engine's own GPU prefix cache."""
        if self.kind != "sidecar" or self.policy in ("roundrobin", "leastload"):
            return ""
        return "gpu" if self.prefix_source == "kv-events" else "single"

    def sidecar_args(self) -> list[str]:
        if self.kind != "sidecar":
            raise ValueError(f"{self.name} is not a sidecar arm")
        source = [] if self.prefix_source == "default" else ["--prefix-source", self.prefix_source]
        return ["--policy", self.policy, "--loadaware-beta", f"{self.beta:g}", *source]


def _beta_name(beta: float) -> str:
    # The reference's cell names: loadaware-b0, -b0.5, -b1.0, -b2.0 (as experiment.arms.loadaware).
    return f"loadaware-b{beta:g}" if beta != int(beta) or beta == 0 else f"loadaware-b{beta:.1f}"


def sidecar_loadaware(beta: float, source: PrefixSource = "lmcache") -> RealArm:
    suffix = "-kvev" if source == "kv-events" else ""
    return RealArm(_beta_name(beta) + suffix, "sidecar", "loadaware", beta, source)


ARMS: tuple[RealArm, ...] = (
    RealArm("kvaware", "sidecar", "kvaware"),
    sidecar_loadaware(0.0), sidecar_loadaware(0.5), sidecar_loadaware(1.0), sidecar_loadaware(2.0),
    RealArm("roundrobin", "sidecar", "roundrobin"),
    RealArm("leastload", "sidecar", "leastload"),
    RealArm("lane-spread", "sidecar", "lane-spread"),
    # The sidecar as the README tells an LMCache user to run it: --policy auto and no --prefix-source (with
    # --lmcache-url and --tokenizer: LMCache and the sidecar's record beside it); and auto with KV events.
    RealArm("default", "sidecar", "auto", prefix_source="default"),
    RealArm("default-kvev", "sidecar", "auto", prefix_source="kv-events"),
    sidecar_loadaware(0.5, "kv-events"), sidecar_loadaware(1.0, "kv-events"),
    RealArm("kvaware-kvev", "sidecar", "kvaware", prefix_source="kv-events"),
    # Peers with their default thresholds (the comparison is with them as shipped): only --policy cache_aware
    # is set.
    RealArm("sglang-router", "peer", "cache_aware", peer="sglang-router"),
    RealArm("vllm-router", "peer", "cache_aware", peer="vllm-router"),
)
ARMS_BY_NAME = {a.name: a for a in ARMS}

# What `make experiment` runs by default: every arm the issue asks for (kvaware-kvev and lane-spread are optional
# context).
DEFAULT_ARMS = tuple(a.name for a in ARMS if a.name not in ("kvaware-kvev", "lane-spread", "default", "default-kvev"))
# `make experiment-quick`: the arms the targets are judged on, within its 15-minute budget.
QUICK_ARMS = ("kvaware", "loadaware-b0.5", "loadaware-b0.5-kvev", "roundrobin", "sglang-router", "vllm-router")


def arm_by_name(name: str) -> RealArm:
    """A listed arm, `loadaware-b<beta>[-kvev]` for any beta, or `<policy>[-kvev]` for any sidecar policy."""
    if name in ARMS_BY_NAME:
        return ARMS_BY_NAME[name]
    base, kvev = (name[: -len("-kvev")], True) if name.endswith("-kvev") else (name, False)
    if base.startswith("loadaware-b"):
        try:
            beta = float(base.removeprefix("loadaware-b"))
        except ValueError:
            raise ValueError(f"unknown arm {name!r}") from None
        return sidecar_loadaware(beta, "kv-events" if kvev else "lmcache")
    if base in POLICY_NAMES:  # any other sidecar policy by its --policy name, with its default parameters
        return RealArm(name, "sidecar", base, prefix_source="kv-events" if kvev else "lmcache")
    raise ValueError(f"unknown arm {name!r}; known: {', '.join(ARMS_BY_NAME)}")


def parse_arms(spec: str) -> list[RealArm]:
    """Comma list of arm names; `all` = DEFAULT_ARMS, `quick` = QUICK_ARMS (duplicates dropped)."""
    names: list[str] = []
    for part in (p.strip() for p in spec.split(",")):
        if not part:
            continue
        expanded = DEFAULT_ARMS if part == "all" else QUICK_ARMS if part == "quick" else (part,)
        names += [n for n in expanded if n not in names]
    return [arm_by_name(n) for n in names]
