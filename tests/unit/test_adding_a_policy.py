"""docs/architecture.md, "Adding a policy": the worked example, taken from the document as written, is one module
and one registry line, and with nothing else the flag accepts it, the pipeline fills what it declares and it
decides."""

from __future__ import annotations

import asyncio
import re

import pytest

import loadaware.policies as policies
from loadaware.config import ConfigError, from_args
from loadaware.fleet.registry import EndpointRegistry
from loadaware.lifecycle import RequestLifecycle
from loadaware.load.signals import SignalTracker
from loadaware.load.tracker import LoadTracker
from loadaware.routing.builder import build_decider
from loadaware.routing.request import InferenceRequest
from testkit.doc_examples import example_module

FLEET = ("127.0.0.2:8000", "127.0.0.3:8000")


class Matches:
    name = "fixed"

    async def matches(self, tokens: object, endpoints: tuple[str, ...], salt: str | None = None) -> dict[str, int]:
        return {FLEET[0]: 600}


def test_the_documented_policy_is_one_module_and_one_registry_line(monkeypatch: pytest.MonkeyPatch) -> None:
    module, registry_line = example_module(monkeypatch, "Adding a policy", "loadaware.policies.shortest_lane")
    entry = re.fullmatch(r'\s*"([\w-]+)": (lambda beta: \w+\(\)),\s*', registry_line)
    assert entry is not None, registry_line
    name, factory = entry[1], eval(entry[2], module.__dict__)
    monkeypatch.setitem(policies.POLICIES, name, factory)

    settings = from_args(["--policy", name, "--endpoints", ",".join(FLEET)], environ={})
    assert settings.effective_policy == name
    policy = policies.make_policy(name)
    assert policy.needs.signals and policy.needs.prefix and not policy.needs.working_set
    signals = SignalTracker()
    lifecycle = RequestLifecycle()
    lifecycle.subscribe(signals)
    decider = build_decider(policy, EndpointRegistry(FLEET), LoadTracker(stale_s=5), lifecycle,
                      prefix_source=Matches(), signals=signals)
    first = asyncio.run(decider.decide(InferenceRequest("completions", prompt=list(range(1000))), "r1"))
    assert first.policy == name and first.endpoint == FLEET[0]  # 400 uncached tokens against 1,000
    assert decider.working_set is None and decider.queued is None  # nothing it did not ask for
    # The first request's 400 tokens are still being prefilled there: 800 ahead against the other's 1,000.
    second = asyncio.run(decider.decide(InferenceRequest("completions", prompt=list(range(1000))), "r2"))
    assert second.endpoint == FLEET[0]
    third = asyncio.run(decider.decide(InferenceRequest("completions", prompt=list(range(1000))), "r3"))
    assert third.endpoint == FLEET[1]  # 1,200 ahead there now: the other engine's whole prompt is less
    with pytest.raises(ConfigError, match="--policy: 'no-such-policy'"):
        from_args(["--policy", "no-such-policy", "--endpoints", FLEET[0]], environ={})
    with pytest.raises(ConfigError, match="LOADAWARE_POLICY: 'nonsense'"):  # the environment too: no start
        from_args(["--endpoints", FLEET[0]], environ={"LOADAWARE_POLICY": "nonsense"})
