"""The benchmarks name only policies the sidecar offers: a policy that left the product must not leave a
benchmark or probe that fails at start (research.probes.signals_cost, then bench/, named `predictive` and
`lane` after both were gone)."""

from __future__ import annotations

import pytest

from bench import extproc_inprocess
from loadaware.policies import POLICIES
from loadaware.policies.auto import AUTO
from research.probes import signals_cost


@pytest.mark.parametrize("name", [*signals_cost.POLICIES, *extproc_inprocess.COMPARED])
def test_every_benchmarked_policy_is_offered(name: str) -> None:
    assert name == AUTO or name in POLICIES
