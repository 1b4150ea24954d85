"""Envoy whose `engines` cluster membership changes at run time: EDS served from a watched file.

`eds_config(...)` turns the shipped envoy/envoy.yaml into one whose engines cluster is `type: EDS` with a
`path_config_source`; `write_assignment(...)` atomically replaces the ClusterLoadAssignment (write, then
rename into the watched directory, which is what Envoy reacts to). Used by the discovery tests to show the
sidecar's envoy-admin source following a real Envoy, the way it would follow Istio's or any xDS server's.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from loadaware.fleet.addresses import parse_hostport
from testkit.paths import ENVOY_CONFIG

ASSIGNMENT_FILE = "eds.yaml"


def eds_config(directory: Path, listen_port: int, admin_port: int, sidecar_port: int,
               base: Path = ENVOY_CONFIG, sidecar_host: str | None = None) -> Path:
    """Write envoy.yaml with the engines cluster on file-based EDS into `directory`; returns its path."""
    config: dict[str, Any] = yaml.safe_load(base.read_text())
    config["node"] = {"id": "loadaware-gateway", "cluster": "loadaware"}  # xDS needs a node identity
    config["admin"]["address"]["socket_address"]["port_value"] = admin_port
    config["static_resources"]["listeners"][0]["address"]["socket_address"]["port_value"] = listen_port
    for cluster in config["static_resources"]["clusters"]:
        if cluster["name"] == "engines":
            cluster["type"] = "EDS"
            cluster.pop("load_assignment", None)
            cluster["eds_cluster_config"] = {"eds_config": {
                "resource_api_version": "V3",
                "path_config_source": {"path": str(directory / ASSIGNMENT_FILE),
                                       "watched_directory": {"path": str(directory)}}}}
        elif cluster["name"] == "loadaware_sidecar":
            endpoint = cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]
            endpoint["address"]["socket_address"]["port_value"] = sidecar_port
            if sidecar_host is not None:
                endpoint["address"]["socket_address"]["address"] = sidecar_host
    path = directory / "envoy-eds.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def write_assignment(directory: Path, hosts: Sequence[tuple[str, str]], version: int) -> None:
    """hosts: (HOST:PORT, EDS health status such as HEALTHY, UNHEALTHY, DRAINING, DEGRADED)."""
    lb_endpoints = []
    for endpoint, health in hosts:
        host, port = parse_hostport(endpoint)  # Envoy takes IPv6 hosts bare here
        lb_endpoints.append({"endpoint": {"address": {"socket_address": {"address": host, "port_value": port}}},
                             "health_status": health})
    doc = {"version_info": str(version), "resources": [{
        "@type": "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment",
        "cluster_name": "engines", "endpoints": [{"lb_endpoints": lb_endpoints}]}]}
    tmp = directory / f".{ASSIGNMENT_FILE}.{version}.tmp"
    tmp.write_text(yaml.safe_dump(doc, sort_keys=False))
    os.replace(tmp, directory / ASSIGNMENT_FILE)  # Envoy watches the directory for this move
