"""Apply an Istio EnvoyFilter's configPatches to an Envoy config, the way istiod does, for validation.

Covers what k8s/istio/envoyfilter.yaml uses: CLUSTER ADD, CLUSTER MERGE (matched by service and port, i.e.
the `outbound|PORT||SERVICE` cluster Istio generates), and HTTP_FILTER INSERT_BEFORE / INSERT_AFTER /
INSERT_FIRST relative to a sub-filter of a listener's HTTP connection manager. MERGE uses protobuf's own
message merge on envoy.config.cluster.v3.Cluster (xds-protos), which is what istiod does (proto.Merge):
scalars replaced, messages merged, repeated fields appended; a field whose contents xds-protos does not know
yet is set when the cluster lacks it (what a merge does) and refused otherwise.
"""

from __future__ import annotations

import copy
import json
from typing import Any

# Importing these registers the types that the configs' typed_config / Any fields name.
from envoy.config.cluster.v3 import cluster_pb2
from envoy.extensions.load_balancing_policies.least_request.v3 import least_request_pb2  # noqa: F401
from envoy.extensions.load_balancing_policies.override_host.v3 import override_host_pb2  # noqa: F401
from envoy.extensions.upstreams.http.v3 import http_protocol_options_pb2  # noqa: F401
from google.protobuf import json_format

HCM = "envoy.filters.network.http_connection_manager"


def _context_matches(match: dict[str, Any], context: str) -> bool:
    return match.get("context", "ANY") in ("ANY", context)


def _cluster_matches(cluster: dict[str, Any], match: dict[str, Any]) -> bool:
    want = match.get("cluster")
    if not want:
        return True
    if "name" in want:
        return cluster["name"] == want["name"]
    direction, port, subset, service = (cluster["name"].split("|") + ["", "", "", ""])[:4]
    return (direction == "outbound" and (not want.get("service") or want["service"] == service)
            and (not want.get("portNumber") or int(want["portNumber"]) == int(port or 0))
            and want.get("subset", "") == subset)


def merge_cluster(cluster: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    known, newer = _split_by_xds_protos(patch)
    message = json_format.ParseDict(cluster, cluster_pb2.Cluster())
    message.MergeFrom(json_format.ParseDict(known, cluster_pb2.Cluster()))
    # through JSON: plain dicts (MessageToDict gives OrderedDicts for Any values)
    merged: dict[str, Any] = json.loads(json_format.MessageToJson(message, preserving_proto_field_name=True))
    for key, value in newer.items():
        # A field absent from the cluster is set by a merge, whatever it holds; merging into one that exists
        # would need the field's proto, which xds-protos does not have yet.
        if key in merged:
            raise ValueError(f"cannot emulate merging {key!r}: xds-protos lacks some of its fields")
        merged[key] = value
    return merged


def _split_by_xds_protos(patch: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The patch's top-level fields xds-protos can parse, and those it cannot: xds-protos lags Envoy's API (e.g.
    override_host's selected_host_key, which the Envoy binary the tests run does know and validates)."""
    known: dict[str, Any] = {}
    newer: dict[str, Any] = {}
    for key, value in patch.items():
        try:
            json_format.ParseDict({key: value}, cluster_pb2.Cluster())
        except json_format.ParseError:
            newer[key] = value
        else:
            known[key] = value
    return known, newer


def _http_filter_lists(config: dict[str, Any], match: dict[str, Any]) -> list[list[dict[str, Any]]]:
    listener_match = match.get("listener", {})
    port = listener_match.get("portNumber")
    wanted_filter = listener_match.get("filterChain", {}).get("filter", {}).get("name", HCM)
    out = []
    for listener in config["static_resources"].get("listeners", []):
        if port is not None and listener["address"]["socket_address"]["port_value"] != port:
            continue
        for chain in listener.get("filter_chains", []):
            for network_filter in chain.get("filters", []):
                if network_filter["name"] == wanted_filter == HCM:
                    out.append(network_filter["typed_config"]["http_filters"])
    return out


def apply(config: dict[str, Any], envoyfilter: dict[str, Any], context: str = "GATEWAY") -> dict[str, Any]:
    out = copy.deepcopy(config)
    clusters = out["static_resources"]["clusters"]
    for patch in envoyfilter["spec"]["configPatches"]:
        match = patch.get("match", {})
        if not _context_matches(match, context):
            continue
        operation, value = patch["patch"]["operation"], patch["patch"].get("value")
        if patch["applyTo"] == "CLUSTER":
            if operation == "ADD":
                clusters.append(copy.deepcopy(value))
            elif operation == "MERGE":
                hits = [i for i, c in enumerate(clusters) if _cluster_matches(c, match)]
                if not hits:
                    raise LookupError(f"no cluster matches {match}")
                for i in hits:
                    clusters[i] = merge_cluster(clusters[i], value)
            else:
                raise NotImplementedError(operation)
        elif patch["applyTo"] == "HTTP_FILTER":
            sub = match["listener"]["filterChain"]["filter"].get("subFilter", {}).get("name")
            lists = _http_filter_lists(out, match)
            if not lists:
                raise LookupError(f"no listener matches {match}")
            for filters in lists:
                names = [f["name"] for f in filters]
                if operation == "INSERT_FIRST":
                    filters.insert(0, copy.deepcopy(value))
                elif operation in ("INSERT_BEFORE", "INSERT_AFTER"):
                    if sub not in names:
                        raise LookupError(f"no http filter {sub}")
                    at = names.index(sub) + (operation == "INSERT_AFTER")
                    filters.insert(at, copy.deepcopy(value))
                else:
                    raise NotImplementedError(operation)
        else:
            raise NotImplementedError(patch["applyTo"])
    return out
