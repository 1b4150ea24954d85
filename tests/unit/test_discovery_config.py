"""Discovery settings: refused at start with a message naming the setting; readiness waits for a scrape
round over the discovered fleet, not one that ran while it was still empty."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from loadaware.app import Sidecar
from loadaware.config import ConfigError, from_args, resolve


@pytest.mark.parametrize(("argv", "named"), [
    (["--discovery", "kubernetes"], "--k8s-service"),
    (["--discovery", "envoy-admin"], "--envoy-admin-url"),
    (["--discovery", "file"], "--discovery: file needs --endpoints-file"),
    (["--discovery", "kubernetes", "--k8s-service", "vllm", "--endpoints", "10.0.0.1:8000"], "--discovery"),
    (["--discovery", "static", "--endpoints-file", "/tmp/x"], "--discovery"),
    (["--discovery", "consul"], "--discovery"),
    (["--discovery", "envoy-admin", "--envoy-admin-url", "localhost:9901"], "--envoy-admin-url"),
    (["--discovery", "kubernetes", "--k8s-service", "my service"], "--k8s-service"),
])
def test_incomplete_or_bad_discovery_is_refused_naming_the_setting(argv: list[str], named: str) -> None:
    with pytest.raises(ConfigError) as exc:
        from_args(argv, environ={})
    assert str(exc.value).startswith(named) or named in str(exc.value)


def test_discovery_mode_follows_the_endpoint_flags() -> None:
    assert from_args(["--endpoints", "10.0.0.1:8000"], environ={}).discovery_mode == "static"
    assert from_args(["--endpoints-file", "/tmp/eps"], environ={}).discovery_mode == "file"
    s = resolve({}, {"LOADAWARE_DISCOVERY": "kubernetes", "LOADAWARE_K8S_SERVICE": "vllm-pods",
                     "LOADAWARE_K8S_PORT_NAME": "http"})
    assert (s.discovery_mode, s.k8s_service, s.origins["k8s_service"]) == ("kubernetes", "vllm-pods", "env")
    s = from_args(["--discovery", "envoy-admin", "--envoy-admin-url", "http://127.0.0.1:15000/",
                   "--envoy-cluster", "outbound|8000||vllm.llm.svc.cluster.local"], environ={})
    assert s.envoy_admin_url == "http://127.0.0.1:15000" and s.envoy_cluster.startswith("outbound|8000")


def test_the_cli_refuses_at_start_with_the_setting_named() -> None:
    result = subprocess.run([sys.executable, "-c", "import sys; from loadaware.cli import main; sys.exit(main())",
                             "serve", "--discovery", "kubernetes"], capture_output=True, text=True, timeout=60,
                            cwd=Path(__file__).resolve().parents[2])
    assert result.returncode == 2
    assert "configuration refused: --k8s-service" in result.stderr


def test_readiness_needs_a_scrape_round_over_the_discovered_fleet(tmp_path: Path) -> None:
    empty = tmp_path / "endpoints.txt"
    empty.write_text("")
    sidecar = Sidecar(from_args(["--endpoints-file", str(empty), "--metrics-listen", "off"], environ={}))
    assert not sidecar.readiness.ready()  # no fleet
    sidecar.scraper.rounds = 3  # rounds over the empty fleet
    sidecar.registry.set(["10.0.0.1:8000"])
    assert not sidecar.readiness.ready()  # a round that started before the fleet arrived does not count
    sidecar.scraper.rounds = 4
    assert not sidecar.readiness.ready()
    sidecar.scraper.rounds = 5
    assert not sidecar.readiness.ready()  # its models not asked yet
    assert sidecar.models_poller is not None
    sidecar.models_poller._asked.add("10.0.0.1:8000")
    assert sidecar.readiness.ready()
    sidecar.registry.set([])
    assert not sidecar.readiness.ready()


def test_a_static_fleet_is_ready_after_the_first_round() -> None:
    sidecar = Sidecar(from_args(["--endpoints", "10.0.0.1:8000", "--metrics-listen", "off"], environ={}))
    assert not sidecar.readiness.ready()
    sidecar.scraper.rounds = 1
    assert not sidecar.readiness.ready()  # the engines' models not asked yet: an unknown model could reach an engine
    assert sidecar.models_poller is not None
    sidecar.models_poller._asked.add("10.0.0.1:8000")
    assert sidecar.readiness.ready()
