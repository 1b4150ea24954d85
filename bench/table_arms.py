"""The rows of case 8 (`table`, bench/table.py): which router each one runs and how, as plain data.

Every row routes the same bodies to the same engines at the same rate; only what sits in front of the
engines changes. The sidecar rows all use the default policy (`auto`) so that they differ only in the
prefix source, the tokenizer and the ext_proc mode; the peers run their own `cache_aware` policy.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from loadaware.policies.auto import AUTO
from testkit.paths import ENVOY_CONFIG, ENVOY_PASSTHROUGH_CONFIG, REPO, TINY_TOKENIZER

POOL_CONFIG = REPO / "envoy" / "envoy-inference-pool.yaml"
SIDECAR_POLICY = AUTO
PEER_POLICY = "cache_aware"

RouterKind = Literal["envoy", "sidecar", "peer"]


@dataclass(frozen=True)
class SidecarSetup:
    """What distinguishes one sidecar process from another in the table (arms sharing it share a process)."""

    prefix_source: str  # approx, lmcache, kv-events
    tokenizer: bool

    def args(self, endpoints: list[str], listen: str, metrics_listen: str, lmcache_url: str | None) -> list[str]:
        args = ["--listen", listen, "--endpoints", ",".join(endpoints), "--metrics-listen", metrics_listen,
                "--policy", SIDECAR_POLICY, "--prefix-source", self.prefix_source, "--log-level", "warning"]
        # Without --tokenizer the sidecar works on text: the approximate index keys 64-byte text blocks and
        # no prompt is tokenized (the exact sources need token ids, so they always get the tokenizer).
        if self.tokenizer:
            args += ["--tokenizer", str(TINY_TOKENIZER)]
        if self.prefix_source == "lmcache":
            if lmcache_url is None:
                raise ValueError("the lmcache prefix source needs the LMCache controller")
            args += ["--lmcache-url", lmcache_url]
        return args


@dataclass(frozen=True)
class TableArm:
    key: str  # the letter: rows print in this order
    name: str  # stable id in results.json
    label: str
    kind: RouterKind
    envoy_config: Path | None = None
    sidecar: SidecarSetup | None = None
    peer: str = ""
    # False: the BUFFERED config without the response headers (no request outcomes for failure-aware
    # routing), to price that message (one more ext_proc round trip per request).
    response_headers: bool = True

    @property
    def mode(self) -> str:
        if self.kind == "peer":
            return PEER_POLICY
        if self.sidecar is None:
            return "-"
        return "full duplex" if self.envoy_config == POOL_CONFIG else "BUFFERED"


APPROX = SidecarSetup("approx", tokenizer=False)
APPROX_TOK = SidecarSetup("approx", tokenizer=True)
LMCACHE_TOK = SidecarSetup("lmcache", tokenizer=True)
KVEV_TOK = SidecarSetup("kv-events", tokenizer=True)

ARMS: tuple[TableArm, ...] = (
    TableArm("a", "envoy_alone", "Envoy alone", "envoy", ENVOY_PASSTHROUGH_CONFIG),
    TableArm("b", "buffered_approx", "Envoy + sidecar, approx prefix, no tokenizer", "sidecar", ENVOY_CONFIG, APPROX),
    TableArm("c", "buffered_approx_tok", "Envoy + sidecar, approx prefix, tokenizer", "sidecar", ENVOY_CONFIG,
             APPROX_TOK),
    TableArm("c2", "buffered_approx_tok_no_outcomes", "as c, response headers SKIP (no failure-aware outcomes)",
             "sidecar", ENVOY_CONFIG, APPROX_TOK, response_headers=False),
    TableArm("d", "buffered_lmcache_tok", "Envoy + sidecar, LMCache prefix, tokenizer", "sidecar", ENVOY_CONFIG,
             LMCACHE_TOK),
    TableArm("e", "buffered_kvevents_tok", "Envoy + sidecar, KV-events prefix, tokenizer", "sidecar", ENVOY_CONFIG,
             KVEV_TOK),
    TableArm("f", "duplex_approx", "Envoy + sidecar, approx prefix, no tokenizer", "sidecar", POOL_CONFIG, APPROX),
    TableArm("g", "duplex_approx_tok", "Envoy + sidecar, approx prefix, tokenizer", "sidecar", POOL_CONFIG,
             APPROX_TOK),
    TableArm("h", "sglang_router", "sglang-router", "peer", peer="sglang-router"),
    TableArm("i", "vllm_router", "vllm-router", "peer", peer="vllm-router"),
)


def arms_by_name(names: str) -> tuple[TableArm, ...]:
    """`all`, or a comma list of names or letters, in the table's order."""
    wanted = {n.strip() for n in names.split(",") if n.strip()}
    if not wanted or wanted == {"all"}:
        return ARMS
    known = {a.name for a in ARMS} | {a.key for a in ARMS}
    unknown = sorted(wanted - known)
    if unknown:
        raise ValueError(f"unknown table arm(s) {unknown}; expected names or letters of {[a.name for a in ARMS]}")
    return tuple(a for a in ARMS if a.name in wanted or a.key in wanted)


def run_order(arms: tuple[TableArm, ...]) -> list[TableArm]:
    """Arms grouped so that those sharing a sidecar setup run back to back on one sidecar process (BUFFERED
    and full duplex are served on the same port): fewer restarts, and each group's warm-up is its own."""
    groups: dict[object, list[TableArm]] = {}
    for arm in arms:
        groups.setdefault(arm.sidecar if arm.sidecar is not None else arm.name, []).append(arm)
    return [arm for group in groups.values() for arm in group]
