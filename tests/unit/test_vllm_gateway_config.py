"""The real-vLLM tier's Envoy configs (testkit/vllm_gateway.py): the shipped ones, with the real engines, free ports
and at least the shared test machine's ext_proc message budget."""

from __future__ import annotations

from pathlib import Path

import yaml

from testkit.vllm_gateway import ENVOY_CONFIGS, MESSAGE_TIMEOUT_S, envoy_config


def ext_proc_timeouts(config: dict) -> list[str]:
    return [f["typed_config"]["message_timeout"]
            for listener in config["static_resources"]["listeners"]
            for chain in listener["filter_chains"] for nf in chain["filters"]
            for f in nf["typed_config"].get("http_filters", ()) if f["name"] == "envoy.filters.http.ext_proc"]


def test_message_budget_is_raised_never_lowered(tmp_path: Path) -> None:
    shipped = {mode: ext_proc_timeouts(yaml.safe_load(path.read_text())) for mode, path in ENVOY_CONFIGS.items()}
    assert shipped == {"sidecar": ["1s"], "inference-pool": ["1000s"]}
    for mode, path in ENVOY_CONFIGS.items():
        out = envoy_config(path, tmp_path / f"{mode}.yaml", ["127.0.0.1:8001", "127.0.0.1:8002"], 50051)
        config = yaml.safe_load(out.read_text())
        assert ext_proc_timeouts(config) == ([f"{MESSAGE_TIMEOUT_S}s"] if mode == "sidecar" else ["1000s"])
        engines = next(c for c in config["static_resources"]["clusters"] if c["name"] == "engines")
        ports = [e["endpoint"]["address"]["socket_address"]["port_value"]
                 for e in engines["load_assignment"]["endpoints"][0]["lb_endpoints"]]
        assert ports == [8001, 8002]
