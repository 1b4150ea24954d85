"""testkit/prometheus.py without a Prometheus: the CI rule, the rules file, the scrape configuration."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from testkit import prometheus as prom


def test_a_missing_prometheus_fails_under_ci_and_skips_elsewhere(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(prom, "binary", lambda name: None)
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI=true"):
        prom.require_prometheus()
    monkeypatch.setenv("CI", "")
    with pytest.raises(pytest.skip.Exception):
        prom.require_prometheus()


def test_rules_file_is_the_prometheusrule_spec(tmp_path: Path) -> None:
    written = yaml.safe_load(prom.write_rules(tmp_path).read_text())
    spec = yaml.safe_load(prom.RULES_SOURCE.read_text())["spec"]
    assert written == {"groups": spec["groups"]} and len(written["groups"][0]["rules"]) >= 8


def test_scrape_config_carries_labels_and_paths() -> None:
    config = prom.scrape_config([{"job": "envoy", "targets": ["127.0.0.1:9901"], "labels": {"pool": "p"},
                                  "metrics_path": "/stats/prometheus"}], interval_s=0.5)
    (job,) = config["scrape_configs"]
    assert config["global"]["scrape_interval"] == "500ms"
    assert job["metrics_path"] == "/stats/prometheus"
    assert job["static_configs"] == [{"targets": ["127.0.0.1:9901"], "labels": {"pool": "p"}}]
