"""The simulator's arms: a registry of name -> how to make the arm's policy and what it reads.

An arm is a policy the discrete-event simulator (`experiment.des`) routes with. Every arm decides through the
sidecar's own pipeline on the same candidates; what an arm reads beyond them, the simulator provides because the
arm's entry declares it (`Reads`), never because of the policy's type:

- `tree_signals`: the KV blocks of the requests in flight and the prompt tokens ever routed, per engine (the
  peers' radix-tree signals, `experiment.tree_signals`): the simulation counts them and widens the candidates.
- `ttft_models`: each engine's TTFT model learned over every request (the sidecar learns it only for the
  prefill clock): the router learns it, and the entry's function adds its prices to the candidates.
- `simulation`: the arm's policy is handed the running simulation (its clock, its engines' service models):
  a design bound that knows what no router can, never a router.

This module registers the sidecar's policies (`SIDECAR_ARMS`, and any `--policy` name or `loadaware-b<beta>` on
demand) and the peers' published policies (`PEER_ARMS`). More arms register from above: the research package
registers its own when `research.arms` is imported (`python -m research grid ...` runs an experiment command
with them); nothing here imports it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from experiment.peers import PEER_POLICIES
from loadaware.load.signals import SignalTracker
from loadaware.policies import POLICY_NAMES, Policy, make_policy
from loadaware.policies.base import Candidate

if TYPE_CHECKING:
    from experiment.des import Simulation

# Candidates -> the same candidates, in the same order, with each endpoint's TTFT model prices added.
TtftPrices = Callable[[Sequence[Candidate], SignalTracker], Sequence[Candidate]]
# (the arm's policy, the simulation) -> None: hands the policy what it reads from the simulation.
BindSimulation = Callable[[Policy, "Simulation"], None]


@dataclass(frozen=True)
class Reads:
    """What an arm reads beyond the candidates the sidecar's pipeline builds (module docstring). Functions
    here must be module-level (the grids pickle arms into their worker processes)."""

    tree_signals: bool = False
    ttft_models: TtftPrices | None = None
    simulation: BindSimulation | None = None

    def __post_init__(self) -> None:
        if self.tree_signals and self.ttft_models is not None:
            raise ValueError("an arm reads the tree signals or the TTFT models, not both")


@dataclass(frozen=True)
class Arm:
    name: str  # as in the reference's cells: kvaware, loadaware-b0.5, roundrobin, ...
    policy: str
    beta: float = 1.0
    factory: Callable[[], Policy] | None = None  # None: the sidecar's make_policy(policy, beta)
    reads: Reads = field(default_factory=Reads)

    def make(self) -> Policy:
        return self.factory() if self.factory is not None else make_policy(self.policy, self.beta)


_REGISTRY: dict[str, Arm] = {}


def register(*arms: Arm) -> None:
    """Add arms by their names. Registering the same arm again is a no-op (a module imported twice); another
    arm under a registered name is an error."""
    for arm in arms:
        known = _REGISTRY.get(arm.name)
        if known is not None and known != arm:
            raise ValueError(f"arm {arm.name!r} is already registered as {known}")
        _REGISTRY[arm.name] = arm


def registered() -> tuple[str, ...]:
    """The registered arms' names, in registration order."""
    return tuple(_REGISTRY)


def loadaware(beta: float) -> Arm:
    return Arm(f"loadaware-b{beta:g}" if beta != int(beta) or beta == 0 else f"loadaware-b{beta:.1f}",
               "loadaware", beta)


def arm_by_name(name: str) -> Arm:
    """A registered arm, "loadaware-b<beta>" for any beta, or any sidecar `--policy` name (default parameters:
    "loadaware" is beta 1.0)."""
    if name in _REGISTRY:
        return _REGISTRY[name]
    if name.startswith("loadaware-b"):
        try:
            return loadaware(float(name.removeprefix("loadaware-b")))
        except ValueError:
            raise ValueError(f"unknown arm {name!r}") from None
    if name in POLICY_NAMES:
        return Arm(name, name)
    raise ValueError(f"unknown arm {name!r}; registered: {', '.join(_REGISTRY)}; research arms register when "
                     "research.arms is imported: `python -m research <experiment command> ...`")


SIDECAR_ARMS: tuple[Arm, ...] = (
    Arm("kvaware", "kvaware"), loadaware(0.0), loadaware(0.5), loadaware(1.0), loadaware(2.0),
    Arm("roundrobin", "roundrobin"), Arm("leastload", "leastload"),
)
PEER_ARMS: tuple[Arm, ...] = tuple(Arm(name, name, factory=cls, reads=Reads(tree_signals=True))
                                   for name, cls in PEER_POLICIES.items())
register(*SIDECAR_ARMS, *PEER_ARMS)
