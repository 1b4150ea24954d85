"""JSON Schemas for the custom resources the manifests use, transcribed from the CRDs' openAPIV3Schema
(prometheus-operator monitoring.coreos.com/v1; Istio networking.istio.io v1 and v1alpha3; Gateway API
gateway.networking.k8s.io/v1 standard channel: GatewayClass, Gateway, HTTPRoute; Gateway API Inference
Extension inference.networking.k8s.io/v1: InferencePool, inference.networking.x-k8s.io/v1alpha2:
InferenceObjective) for the fields the manifests set. kubernetes-validate
knows only built-in kinds; these close the gap. Unknown fields are rejected, so a typo fails here as
`kubectl apply` would fail against the real CRD. The CRDs' CEL rules (x-kubernetes-validations) that concern
these fields are transcribed as JSON Schema conditions, with the CRDs' defaults in mind."""

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


_RELABEL_ACTIONS = ["replace", "Replace", "keep", "Keep", "drop", "Drop", "hashmod", "HashMod", "labelmap", "LabelMap",
                    "labeldrop", "LabelDrop", "labelkeep", "LabelKeep", "lowercase", "Lowercase", "uppercase",
                    "Uppercase", "keepequal", "KeepEqual", "dropequal", "DropEqual"]
RELABEL_CONFIG = obj({
    "sourceLabels": {"type": "array", "items": {"type": "string", "pattern": r"^[a-zA-Z_][a-zA-Z0-9_]*$"}},
    "separator": STR, "targetLabel": STR, "regex": STR, "modulus": INT, "replacement": STR,
    "action": {"enum": _RELABEL_ACTIONS},
})
POD_MONITOR = resource("monitoring.coreos.com/v1", "PodMonitor", obj({
    "selector": obj({"matchLabels": LABELS}),
    "podMetricsEndpoints": {"type": "array", "items": obj({
        "port": STR, "path": STR, "interval": DURATION, "scrapeTimeout": DURATION,
        "scheme": {"enum": ["http", "https"]},
        "relabelings": {"type": "array", "items": RELABEL_CONFIG},
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
        "retries": obj({"attempts": INT, "perTryTimeout": DURATION, "retryOn": STR,
                        "retryRemoteLocalities": {"type": "boolean"}}),
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
        "outlierDetection": obj({
            "consecutive5xxErrors": {"type": "integer", "minimum": 0, "maximum": 4294967295},
            "consecutiveGatewayErrors": {"type": "integer", "minimum": 0, "maximum": 4294967295},
            "consecutiveLocalOriginFailures": {"type": "integer", "minimum": 0, "maximum": 4294967295},
            "splitExternalLocalOriginErrors": {"type": "boolean"},
            "interval": DURATION, "baseEjectionTime": DURATION,
            "maxEjectionPercent": {"type": "integer", "minimum": 0, "maximum": 100},
            "minHealthPercent": {"type": "integer", "minimum": 0, "maximum": 100},
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

# ---- Gateway API (kubernetes-sigs/gateway-api config/crd/standard, v1) ---------------------------------

_DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
GROUP = {"type": "string", "maxLength": 253, "pattern": r"^$|" + _DNS_SUBDOMAIN}
KIND = {"type": "string", "minLength": 1, "maxLength": 63, "pattern": r"^[a-zA-Z]([-a-zA-Z0-9]*[a-zA-Z0-9])?$"}
OBJECT_NAME = {"type": "string", "minLength": 1, "maxLength": 253}
NAMESPACE = {"type": "string", "minLength": 1, "maxLength": 63, "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"}
SECTION_NAME = {"type": "string", "minLength": 1, "maxLength": 253, "pattern": _DNS_SUBDOMAIN}
PORT_NUMBER = {"type": "integer", "minimum": 1, "maximum": 65535}
HOSTNAME = {"type": "string", "minLength": 1, "maxLength": 253,
            "pattern": r"^(\*\.)?[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"}
CONTROLLER_NAME = {"type": "string", "minLength": 1, "maxLength": 253,
                   "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\/"
                              r"[A-Za-z0-9\/\-._~%!$&'()*+,;=:]+$"}
GATEWAY_DURATION = {"type": "string", "pattern": r"^([0-9]{1,5}(h|m|s|ms)){1,4}$"}


def array(items: dict[str, Any], min_items: int = 0, max_items: int | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "array", "items": items}
    if min_items:
        out["minItems"] = min_items
    if max_items is not None:
        out["maxItems"] = max_items
    return out


GATEWAY_CLASS = resource("gateway.networking.k8s.io/v1", "GatewayClass", obj({
    "controllerName": CONTROLLER_NAME,
    "description": {"type": "string", "maxLength": 64},
}, ("controllerName",)))

GATEWAY = resource("gateway.networking.k8s.io/v1", "Gateway", obj({
    "gatewayClassName": OBJECT_NAME,
    "listeners": array(obj({
        "name": SECTION_NAME,
        "hostname": HOSTNAME,
        "port": PORT_NUMBER,
        "protocol": {"type": "string", "minLength": 1, "maxLength": 255,
                     "pattern": r"^[a-zA-Z0-9]([-a-zA-Z0-9]*[a-zA-Z0-9])?$|[a-z0-9]([-a-z0-9]*[a-z0-9])?"
                                r"(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\/[A-Za-z0-9]+$"},
        "allowedRoutes": obj({
            "namespaces": obj({"from": {"enum": ["All", "Selector", "Same"]},
                               "selector": obj({"matchLabels": LABELS})}),
            "kinds": array(obj({"group": GROUP, "kind": KIND}, ("kind",)), max_items=8),
        }),
    }, ("name", "port", "protocol")), min_items=1, max_items=64),
}, ("gatewayClassName", "listeners")))

# An HTTPRoute backendRef defaults to group "" and kind Service; then the port is required (CEL rule).
_BACKEND_REF = {**obj({"group": GROUP, "kind": KIND, "name": OBJECT_NAME, "namespace": NAMESPACE, "port": PORT_NUMBER,
                       "weight": {"type": "integer", "minimum": 0, "maximum": 1000000}}, ("name",)),
                "if": {"properties": {"group": {"const": ""}, "kind": {"const": "Service"}}},
                "then": {"required": ["port"]}}
# Exact and PathPrefix values are absolute paths (CEL rule).
_PATH_MATCH = {**obj({"type": {"enum": ["Exact", "PathPrefix", "RegularExpression"]},
                      "value": {"type": "string", "maxLength": 1024}}),
               "if": {"properties": {"type": {"enum": ["Exact", "PathPrefix"]}}},
               "then": {"properties": {"value": {"pattern": "^/"}}}}
HTTP_ROUTE = resource("gateway.networking.k8s.io/v1", "HTTPRoute", obj({
    "parentRefs": array(obj({"group": GROUP, "kind": KIND, "name": OBJECT_NAME, "namespace": NAMESPACE,
                             "sectionName": SECTION_NAME, "port": PORT_NUMBER}, ("name",)), max_items=32),
    "hostnames": array(HOSTNAME, max_items=16),
    "rules": array(obj({
        "name": SECTION_NAME,
        "matches": array(obj({
            "path": _PATH_MATCH,
            "method": {"enum": ["GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH"]},
            "headers": array(obj({"type": {"enum": ["Exact", "RegularExpression"]},
                                  "name": {"type": "string", "minLength": 1, "maxLength": 256,
                                           "pattern": r"^[A-Za-z0-9!#$%&'*+\-.^_\x60|~]+$"},
                                  "value": {"type": "string", "minLength": 1, "maxLength": 4096}},
                                 ("name", "value")), max_items=16),
        }), max_items=64),
        "backendRefs": array(_BACKEND_REF, max_items=16),
        "timeouts": obj({"request": GATEWAY_DURATION, "backendRequest": GATEWAY_DURATION}),
    }), min_items=1, max_items=16),
}))

# ---- Gateway API Inference Extension (kubernetes-sigs/gateway-api-inference-extension, v1) -------------

_LABEL_VALUE = {"type": "string", "maxLength": 63, "pattern": r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"}
# endpointPickerRef.kind defaults to Service, which needs the port (CEL rule).
_ENDPOINT_PICKER_REF = {**obj({
    "group": GROUP, "kind": KIND, "name": OBJECT_NAME,
    "port": obj({"number": PORT_NUMBER}, ("number",)),
    "failureMode": {"enum": ["FailOpen", "FailClose"]},
}, ("name",)), "if": {"properties": {"kind": {"const": "Service"}}}, "then": {"required": ["port"]}}
INFERENCE_POOL = resource("inference.networking.k8s.io/v1", "InferencePool", obj({
    "selector": obj({"matchLabels": {"type": "object", "minProperties": 1, "maxProperties": 64,
                                     "additionalProperties": _LABEL_VALUE}}, ("matchLabels",)),
    # port numbers must be unique (CEL rule); each item is just its number, so uniqueItems says it
    "targetPorts": {**array(obj({"number": PORT_NUMBER}, ("number",)), min_items=1, max_items=8), "uniqueItems": True},
    "appProtocol": {"enum": ["http", "kubernetes.io/h2c"]},
    "endpointPickerRef": _ENDPOINT_PICKER_REF,
}, ("selector", "targetPorts")))

# inference.networking.x-k8s.io/v1alpha2 (the same project's v1.x release): spec.poolRef (group and kind have
# defaults) is required, spec.priority is an optional integer.
INFERENCE_OBJECTIVE = resource("inference.networking.x-k8s.io/v1alpha2", "InferenceObjective", obj({
    "poolRef": obj({"group": GROUP, "kind": KIND, "name": OBJECT_NAME}, ("name",)),
    "priority": INT,
}, ("poolRef",)))

SCHEMAS = {(s["properties"]["apiVersion"]["const"], s["properties"]["kind"]["const"]): s
           for s in (POD_MONITOR, PROMETHEUS_RULE, ISTIO_GATEWAY, VIRTUAL_SERVICE, DESTINATION_RULE, ENVOY_FILTER,
                     GATEWAY_CLASS, GATEWAY, HTTP_ROUTE, INFERENCE_POOL, INFERENCE_OBJECTIVE)}
