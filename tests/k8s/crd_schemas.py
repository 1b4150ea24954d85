"""JSON Schemas for the custom resources the manifests use, transcribed from the CRDs' openAPIV3Schema
(prometheus-operator monitoring.coreos.com/v1; Istio networking.istio.io v1 and v1alpha3) for the fields
the manifests set. kubernetes-validate knows only built-in kinds; these close the gap. Unknown fields are
rejected, so a typo fails here as `kubectl apply` would fail against the real CRD."""

from __future__ import annotations

from typing import Any


def obj(properties: dict[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": list(required), "additionalProperties": False}


STR = {"type": "string"}
INT = {"type": "integer"}
LABELS = {"type": "object", "additionalProperties": {"type": "string"}}
METADATA = {"type": "object", "required": ["name"], "properties": {"name": STR, "namespace": STR,
                                                                   "labels": LABELS, "annotations": LABELS}}
DURATION = {"type": "string",
            "pattern": r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?"
                       r"(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"}


def resource(api_version: str, kind: str, spec: dict[str, Any]) -> dict[str, Any]:
    return obj({"apiVersion": {"const": api_version}, "kind": {"const": kind}, "metadata": METADATA, "spec": spec},
               ("apiVersion", "kind", "metadata", "spec"))


POD_MONITOR = resource("monitoring.coreos.com/v1", "PodMonitor", obj({
    "selector": obj({"matchLabels": LABELS}),
    "podMetricsEndpoints": {"type": "array", "items": obj({
        "port": STR, "path": STR, "interval": DURATION, "scrapeTimeout": DURATION,
        "scheme": {"enum": ["http", "https"]},
    })},
}, ("selector",)))

PROMETHEUS_RULE = resource("monitoring.coreos.com/v1", "PrometheusRule", obj({
    "groups": {"type": "array", "items": obj({
        "name": STR, "interval": DURATION,
        "rules": {"type": "array", "items": obj({
            "alert": STR, "record": STR, "expr": STR, "for": DURATION, "labels": LABELS, "annotations": LABELS,
        }, ("expr",))},
    }, ("name",))},
}))

_PORT_SELECTOR = obj({"number": INT, "name": STR,
                      "protocol": {"enum": ["HTTP", "HTTPS", "GRPC", "HTTP2", "MONGO", "TCP", "TLS"]}})
ISTIO_GATEWAY = resource("networking.istio.io/v1", "Gateway", obj({
    "selector": LABELS,
    "servers": {"type": "array", "items": obj({"port": _PORT_SELECTOR, "hosts": {"type": "array", "items": STR},
                                               "name": STR}, ("port", "hosts"))},
}))

_STRING_MATCH = {"type": "object", "minProperties": 1, "maxProperties": 1,
                 "properties": {"exact": STR, "prefix": STR, "regex": STR}, "additionalProperties": False}
VIRTUAL_SERVICE = resource("networking.istio.io/v1", "VirtualService", obj({
    "hosts": {"type": "array", "items": STR},
    "gateways": {"type": "array", "items": STR},
    "http": {"type": "array", "items": obj({
        "name": STR,
        "match": {"type": "array", "items": obj({"uri": _STRING_MATCH, "method": _STRING_MATCH})},
        "route": {"type": "array", "items": obj({
            "destination": obj({"host": STR, "subset": STR, "port": obj({"number": INT})}, ("host",)),
            "weight": INT})},
        "timeout": DURATION,
    })},
}))

DESTINATION_RULE = resource("networking.istio.io/v1", "DestinationRule", obj({
    "host": STR,
    "exportTo": {"type": "array", "items": STR},
    "trafficPolicy": obj({
        "loadBalancer": obj({
            "simple": {"enum": ["UNSPECIFIED", "LEAST_CONN", "RANDOM", "PASSTHROUGH", "ROUND_ROBIN", "LEAST_REQUEST"]},
            "localityLbSetting": obj({"enabled": {"type": "boolean"}}),
        }),
    }),
}, ("host",)))

ENVOY_FILTER = resource("networking.istio.io/v1alpha3", "EnvoyFilter", obj({
    "workloadSelector": obj({"labels": LABELS}),
    "priority": INT,
    "configPatches": {"type": "array", "items": obj({
        "applyTo": {"enum": ["INVALID", "LISTENER", "FILTER_CHAIN", "NETWORK_FILTER", "HTTP_FILTER",
                             "ROUTE_CONFIGURATION", "VIRTUAL_HOST", "HTTP_ROUTE", "CLUSTER", "EXTENSION_CONFIG",
                             "BOOTSTRAP", "LISTENER_FILTER"]},
        "match": obj({
            "context": {"enum": ["ANY", "SIDECAR_INBOUND", "SIDECAR_OUTBOUND", "GATEWAY"]},
            "proxy": obj({"proxyVersion": STR, "metadata": LABELS}),
            "listener": obj({
                "portNumber": INT, "name": STR,
                "filterChain": obj({"name": STR, "sni": STR, "transportProtocol": STR, "applicationProtocols": STR,
                                    "destinationPort": INT,
                                    "filter": obj({"name": STR, "subFilter": obj({"name": STR})})}),
            }),
            "cluster": obj({"portNumber": INT, "service": STR, "subset": STR, "name": STR}),
        }),
        "patch": obj({"operation": {"enum": ["INVALID", "MERGE", "ADD", "REMOVE", "INSERT_BEFORE", "INSERT_AFTER",
                                             "INSERT_FIRST", "REPLACE"]},
                      "value": {"type": "object"}, "filterClass": {"enum": ["UNSPECIFIED", "AUTHN", "AUTHZ", "STATS"]}},
                     ("operation",)),
    }, ("applyTo", "patch"))},
}))

SCHEMAS = {(s["properties"]["apiVersion"]["const"], s["properties"]["kind"]["const"]): s
           for s in (POD_MONITOR, PROMETHEUS_RULE, ISTIO_GATEWAY, VIRTUAL_SERVICE, DESTINATION_RULE, ENVOY_FILTER)}
