"""The shipped envoy/envoy.yaml with its `engines` cluster pointed at the run's fleet.

The shipped config lists 3 engines (127.0.0.2-4:8000); the experiment runs 2 (reference point) or 4
(queueing point). Everything else (ext_proc, override_host, timeouts, buffer limits) stays exactly as
shipped, so the real-time arms measure the product's own gateway config. The copy goes into the run's log
directory, next to the logs of the Envoy that uses it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from loadaware.fleet.addresses import parse_hostport
from testkit.paths import ENVOY_CONFIG


def engines_config(endpoints: Sequence[str], directory: Path, base: Path = ENVOY_CONFIG) -> Path:
    """Write envoy.yaml with `engines` = `endpoints` (HOST:PORT) into `directory`; returns its path."""
    if not endpoints:
        raise ValueError("an Envoy engines cluster needs at least one endpoint")
    config: dict[str, Any] = yaml.safe_load(base.read_text())
    lb_endpoints = []
    for ep in endpoints:
        host, port = parse_hostport(ep)  # Envoy takes an IPv6 host bare here
        lb_endpoints.append({"endpoint": {"address": {"socket_address": {"address": host,
                                                                         "port_value": port}}}})
    found = False
    for cluster in config["static_resources"]["clusters"]:
        if cluster["name"] == "engines":
            cluster["load_assignment"] = {"cluster_name": "engines", "endpoints": [{"lb_endpoints": lb_endpoints}]}
            found = True
    if not found:
        raise ValueError(f"{base} has no `engines` cluster")
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"envoy-{len(endpoints)}-engines.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path
