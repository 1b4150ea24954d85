"""Shared by end-to-end tests that run the same request through both shipped deployments: two simulated engines,
one sidecar, and two real Envoys in front of it, the BUFFERED sidecar deployment (envoy/envoy.yaml, its engines
from EDS) and the gateway's picker (full-duplex, envoy/envoy-inference-pool.yaml)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from testkit.envoy import EnvoyProc
from testkit.envoy_eds import eds_config, write_assignment
from testkit.fleet import FleetProc
from testkit.paths import TINY_TOKENIZER
from testkit.ports import free_port
from testkit.sidecar import SidecarProc
from tests.e2e.discovery_helpers import free_fleet_address
from tests.e2e.test_endpoint_picker import picker_config

DEPLOYMENTS = ("buffered", "picker")


@dataclass
class BothDeployments:
    fleet: FleetProc
    sidecar: SidecarProc
    envoys: dict[str, EnvoyProc]  # by deployment

    def url(self, deployment: str) -> str:
        return self.envoys[deployment].url


@contextlib.contextmanager
def both_deployments(log_dir: Path, sidecar_args: Sequence[str] = ()) -> Iterator[BothDeployments]:
    base_ip, port = free_fleet_address(2)
    sidecar_port = free_port()
    with FleetProc(log_dir / "fleet", engines=2, base_ip=base_ip, port=port) as fleet, \
            SidecarProc(["--listen", f"127.0.0.1:{sidecar_port}", "--metrics-listen", f"127.0.0.1:{free_port()}",
                         "--endpoints", ",".join(fleet.endpoints), "--tokenizer", str(TINY_TOKENIZER),
                         *sidecar_args], log_dir=log_dir / "sidecar") as sidecar:
        eds_dir = log_dir / "eds"
        eds_dir.mkdir()
        write_assignment(eds_dir, [(ep, "HEALTHY") for ep in fleet.endpoints], 1)
        buffered = eds_config(eds_dir, listen_port=free_port(), admin_port=free_port(), sidecar_port=sidecar_port)
        picker = picker_config(log_dir / "picker.yaml", listen_port=free_port(), admin_port=free_port(),
                               sidecar_port=sidecar_port, engines=fleet.endpoints)
        with EnvoyProc(buffered, log_dir / "envoy-buffered") as e1, EnvoyProc(picker, log_dir / "envoy-picker") as e2:
            yield BothDeployments(fleet, sidecar, {"buffered": e1, "picker": e2})
