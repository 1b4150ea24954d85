"""Discovery end to end, under traffic through a real Envoy: the endpoints file re-read on change, and the
envoy-admin source following a real Envoy whose engines cluster changes (EDS from a watched file, as an
xDS server or Istio would change it). No request may fail; after each change is visible in the sidecar, no
request goes to an engine outside the new set, and a removed engine's counts are gone at once."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from testkit.envoy import EnvoyProc
from testkit.envoy_eds import eds_config, write_assignment
from testkit.fleet import FleetProc
from testkit.ports import free_port
from testkit.sidecar import SidecarProc
from tests.conftest import wait_until

from .discovery_helpers import RouterClient, Traffic, free_fleet_address

pytestmark = pytest.mark.e2e

# Requests per phase that must start once the change is visible (and before the next): a count of requests,
# not a time, so a slow machine holds a phase longer instead of checking too little traffic.
PHASE_REQUESTS = 20


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FleetProc]:
    base_ip, port = free_fleet_address(3)  # not the shipped fixed addresses: no loopback lock needed
    with FleetProc(tmp_path_factory.mktemp("discovery-fleet"), engines=3, base_ip=base_ip, port=port) as proc:
        yield proc


def served_endpoint(fleet: FleetProc) -> dict[str, str]:
    return {e["name"]: f"{e['ip']}:{e['port']}" for e in fleet.engines}


def debug_state(sidecar: SidecarProc) -> dict:
    return dict(sidecar.debug_json("/debug/state"))  # on its admin HTTP listener


def started_since(traffic: Traffic, since: float, count: int) -> bool:
    """At least `count` requests that started at or after `since` have completed."""
    return len(traffic.between(since, float("inf"))) >= count


def run_phases(traffic: Traffic, client: RouterClient, names: dict[str, str],
               phases: list[tuple[set[str], Callable[[], object]]]) -> None:
    """For each (expected routable set, change): apply the change, wait until the sidecar shows it, hold
    traffic, then check the requests that started after it was visible and before the next change."""
    windows: list[tuple[float, float, set[str]]] = []
    for expected, change in phases:
        changed_at = time.monotonic()
        if windows:
            start, _, prev = windows[-1]
            windows[-1] = (start, changed_at, prev)
        change()
        visible_at = client.wait_routable(expected)
        windows.append((visible_at, float("inf"), expected))
        wait_until(functools.partial(started_since, traffic, visible_at, PHASE_REQUESTS), timeout=30,
                   message=f"{PHASE_REQUESTS} requests after the sidecar showed {sorted(expected)}")
    for start, end, expected in windows:
        sent = traffic.between(start, end)
        assert len(sent) >= PHASE_REQUESTS, f"too little traffic in a phase ({len(sent)})"
        went = {names[s.served_by] for s in sent if s.status == 200}
        assert went <= expected, f"requests reached {sorted(went - expected)} after it left the fleet"


def test_file_reload_adds_and_removes_endpoints_under_traffic(fleet: FleetProc, tmp_path: Path) -> None:
    names = served_endpoint(fleet)
    a, b, c = fleet.endpoints
    endpoints_file = tmp_path / "endpoints.txt"
    endpoints_file.write_text(f"{a}\n{b}\n")
    listen, metrics_listen = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    sidecar = SidecarProc(["--listen", listen, "--metrics-listen", metrics_listen, "--endpoints-file",
                           str(endpoints_file), "--policy", "leastload", "--scrape-interval-s", "0.2",
                           "--scrape-stale-s", "2"], log_dir=tmp_path)
    # Envoy knows all three engines (as a static cluster would); the file decides which the sidecar uses.
    eds_dir = tmp_path / "eds"
    eds_dir.mkdir()
    write_assignment(eds_dir, [(a, "HEALTHY"), (b, "HEALTHY"), (c, "HEALTHY")], 1)
    envoy = EnvoyProc(eds_config(eds_dir, listen_port=free_port(), admin_port=free_port(),
                                 sidecar_port=int(listen.rpartition(":")[2])), tmp_path)
    with sidecar, envoy:
        client = RouterClient(sidecar.admin_listen)  # the debug API's own port
        assert client.routable() == {a, b} and client.endpoints().discovery == "file"

        def write(*eps: str) -> Callable[[], object]:
            return lambda: endpoints_file.write_text("# engines\n" + "\n".join(eps) + "\n")

        with Traffic(envoy.url, workers=6) as traffic:
            wait_until(lambda: traffic.sent, message="traffic flowing through Envoy")
            run_phases(traffic, client, names, [
                ({a, b, c}, write(a, b, c)),
                ({c}, write(c)),
                ({a, c}, write(a, c)),
                ({b}, write(b)),
            ])
        assert traffic.failures() == [], traffic.failures()[:5]
        assert {names[s.served_by] for s in traffic.sent} == {a, b, c}
        # counts of removed endpoints went with them; the rest drain to zero
        state = wait_until(lambda: (s := debug_state(sidecar))["inflight_total"] == 0 and s,
                           message="in-flight counts to drain")
        assert set(state["inflight"]) <= {b}
        client.close()


def test_envoy_admin_discovery_follows_a_real_envoy(fleet: FleetProc, tmp_path: Path) -> None:
    names = served_endpoint(fleet)
    a, b, c = fleet.endpoints
    eds_dir = tmp_path / "eds"
    eds_dir.mkdir()
    version = iter(range(1, 100))
    write_assignment(eds_dir, [(a, "HEALTHY"), (b, "HEALTHY"), (c, "HEALTHY")], next(version))
    listen, metrics_listen = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    admin_port = free_port()
    config = eds_config(eds_dir, listen_port=free_port(), admin_port=admin_port,
                        sidecar_port=int(listen.rpartition(":")[2]))
    # Envoy first: the sidecar finds the engines only through it.
    with EnvoyProc(config, tmp_path) as envoy:
        sidecar = SidecarProc(["--listen", listen, "--metrics-listen", metrics_listen, "--discovery", "envoy-admin",
                               "--envoy-admin-url", f"http://127.0.0.1:{admin_port}", "--envoy-cluster", "engines",
                               "--discovery-interval-s", "0.1", "--policy", "leastload",
                               "--scrape-interval-s", "0.2", "--scrape-stale-s", "2"], log_dir=tmp_path)
        with sidecar:
            client = RouterClient(sidecar.admin_listen)  # the debug API's own port
            assert client.routable() == {a, b, c}
            assert client.endpoints().discovery == "envoy-admin"

            def eds(*hosts: tuple[str, str]) -> Callable[[], object]:
                return lambda: write_assignment(eds_dir, list(hosts), next(version))

            with Traffic(envoy.url, workers=6) as traffic:
                wait_until(lambda: traffic.sent, message="traffic flowing through Envoy")
                run_phases(traffic, client, names, [
                    ({a, b}, eds((a, "HEALTHY"), (b, "HEALTHY"))),  # c leaves the cluster
                    ({a, c}, eds((a, "HEALTHY"), (b, "UNHEALTHY"), (c, "HEALTHY"))),  # c back, b unhealthy
                    ({c}, eds((a, "DRAINING"), (b, "UNHEALTHY"), (c, "HEALTHY"))),
                    ({a, b, c}, eds((a, "HEALTHY"), (b, "HEALTHY"), (c, "DEGRADED"))),
                ])
                # mid-traffic: what the operator sees for an unhealthy host
                write_assignment(eds_dir, [(a, "HEALTHY"), (b, "UNHEALTHY")], next(version))
                client.wait_routable({a})
                rows = {e.endpoint: e for e in client.endpoints().endpoints}
                assert set(rows) == {a, b}
                assert not rows[b].routable and rows[b].health_detail == "eds_health_status=UNHEALTHY"
                assert debug_state(sidecar)["inflight"].get(b, 0) == 0
            assert traffic.failures() == [], traffic.failures()[:5]
            assert {names[s.served_by] for s in traffic.sent} == {a, b, c}
            client.close()
