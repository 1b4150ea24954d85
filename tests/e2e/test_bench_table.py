"""A smoke run of `make bench`'s table (case 8) through real Envoy, the sidecar and, when `make peers` has
installed them, both peer routers: a second of traffic per row, then the JSON and the markdown it writes.
Without `.peers-venv` the peer rows must say so and the rest of the table must still be there."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from bench.run import main
from testkit.peers import peers_available

pytestmark = pytest.mark.e2e

# Envoy alone, BUFFERED without the tokenizer, KV events with it, full duplex with it, both peers.
ROWS = "a,b,e,g,h,i"


@pytest.fixture(scope="module")
def table(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, dict[str, Any]], str]:
    out = tmp_path_factory.mktemp("bench-table")
    rc = main(["--cases", "table", "--quick", "--duration", "1", "--warmup", "0.5", "--arrivals", "fixed",
               "--table-arms", ROWS, "--out", str(out)])
    assert rc == 0
    doc = json.loads((Path(out) / "results.json").read_text())
    assert doc["error"] is None
    return {r["key"]: r for r in doc["table"]["rows"]}, json.dumps(doc)


def test_every_row_that_can_run_routed_every_request(table: tuple[dict[str, dict[str, Any]], str]) -> None:
    rows, _ = table
    assert sorted(rows) == ROWS.split(",")
    runnable = "abeg" + ("hi" if peers_available() else "")
    for key in runnable:
        row = rows[key]
        assert row["error"] is None, row
        assert row["failures"] == 0 and isinstance(row["requests"], int) and row["requests"] >= 150, row
        assert isinstance(row["cpu_us_per_request_total"], float) and row["cpu_us_per_request_total"] > 0, row
    for key in "beg":
        assert set(rows[key]["cpu_us_per_request"]) == {"envoy", "sidecar"}
    # the KV-events row's sidecar indexed what the engines published
    state = rows["e"]["prefix_state"]
    assert isinstance(state, dict) and state.get("loadaware_kv_index_blocks", 0) > 0, state


def test_peer_rows_run_or_say_why(table: tuple[dict[str, dict[str, Any]], str]) -> None:
    rows, _ = table
    for key in "hi":
        if peers_available():
            ratio = rows[key]["ratio_to_fastest_peer"]
            assert isinstance(ratio, float) and math.isfinite(ratio) and ratio >= 1.0, rows[key]
        else:
            assert "make peers" in str(rows[key]["error"])
