"""The InferencePool variant (k8s/inference-pool/): the sidecar as a Gateway API Inference Extension endpoint
picker. Every kustomization renders with a real `kubectl kustomize`; every object validates against the
Kubernetes schemas or the CRDs' transcribed schemas (InferencePool, HTTPRoute, Gateway, GatewayClass,
InferenceObjective); and the pieces agree: the pool's endpointPickerRef reaches the port the picker serves, the
picker follows that pool, its probes ask the gRPC health names the sidecar serves, its Role grants what
inference-pool discovery and the InferenceObjective watch call, and the HTTPRoute sends to the pool through the
gateway's own Gateway."""

from __future__ import annotations

import copy
from typing import Any

import jsonschema
import pytest

from loadaware.config import SETTINGS, resolve
from loadaware.extproc.health import LIVENESS_SERVICE, READINESS_SERVICES
from loadaware.fleet.discovery import objectives
from loadaware.fleet.discovery.inference_pool import API_CALLS, pool_spec

from .crd_schemas import SCHEMAS
from .test_manifests import rendered, validate

POOL_ONLY = "inference-pool"
OBJECTIVES = "inference-pool/objectives"
GATEWAYS = {"inference-pool/istio": "istio", "inference-pool/envoy-gateway": "envoy-gateway"}
VARIANTS = (POOL_ONLY, *GATEWAYS)
INFERENCE_GROUP = "inference.networking.k8s.io"


def by_kind(kustomization: str, kind: str) -> list[dict[str, Any]]:
    return [d for d in rendered(kustomization) if d["kind"] == kind]


def one(kustomization: str, kind: str) -> dict[str, Any]:
    (doc,) = by_kind(kustomization, kind)
    return doc


def picker(kustomization: str) -> dict[str, Any]:
    (container,) = one(kustomization, "Deployment")["spec"]["template"]["spec"]["containers"]
    return container


def env_of(kustomization: str) -> dict[str, str]:
    return {e["name"]: e["value"] for e in picker(kustomization)["env"]}


# ---- render and validate ----------------------------------------------------------------------------

@pytest.mark.parametrize("kustomization", VARIANTS)
def test_kustomization_renders_and_every_object_validates(kustomization: str) -> None:
    docs = rendered(kustomization)
    kinds = sorted(d["kind"] for d in docs)
    expected = ["Deployment", "HTTPRoute", "InferencePool", "NetworkPolicy", "Role", "RoleBinding", "Service",
                "ServiceAccount"]
    expected += {POOL_ONLY: [], "inference-pool/istio": ["Gateway"],
                 "inference-pool/envoy-gateway": ["Gateway", "GatewayClass"]}[kustomization]
    assert kinds == sorted(expected)
    for doc in docs:
        validate(doc)
    # the custom resources were checked against their CRDs' schemas, not waved through
    custom = {(d["apiVersion"], d["kind"]) for d in docs
              if d["apiVersion"].startswith(("gateway.networking.k8s.io/", f"{INFERENCE_GROUP}/"))}
    assert custom and custom <= set(SCHEMAS)


def test_the_transcribed_schemas_reject_what_the_crds_reject() -> None:
    pool = one(POOL_ONLY, "InferencePool")
    for mistake in (
        lambda p: p["spec"]["endpointPickerRef"].update(failureMode="FailClosed"),  # not FailOpen|FailClose
        lambda p: p["spec"]["endpointPickerRef"].pop("port"),  # a Service reference needs its port
        lambda p: p["spec"]["targetPorts"].append({"number": 8000}),  # port numbers are unique
        lambda p: p["spec"]["targetPorts"].__setitem__(0, {"number": 70000}),
        lambda p: p["spec"]["selector"].update(matchLabels={}),  # at least one label
        lambda p: p["spec"].update(targetPort=8000),  # unknown field
    ):
        broken = copy.deepcopy(pool)
        mistake(broken)
        with pytest.raises(jsonschema.ValidationError):
            validate(broken)
    no_kind = copy.deepcopy(pool)
    del no_kind["spec"]["endpointPickerRef"]["kind"], no_kind["spec"]["endpointPickerRef"]["port"]
    with pytest.raises(jsonschema.ValidationError):  # kind defaults to Service: the port is still needed
        validate(no_kind)
    route = one(POOL_ONLY, "HTTPRoute")
    to_service = copy.deepcopy(route)
    to_service["spec"]["rules"][0]["backendRefs"] = [{"name": "vllm"}]  # a Service by default: needs a port
    with pytest.raises(jsonschema.ValidationError):
        validate(to_service)
    relative = copy.deepcopy(route)
    relative["spec"]["rules"][0]["matches"][0]["path"]["value"] = "v1"
    with pytest.raises(jsonschema.ValidationError):
        validate(relative)
    gateway = one("inference-pool/istio", "Gateway")
    no_listeners = copy.deepcopy(gateway)
    no_listeners["spec"]["listeners"] = []
    with pytest.raises(jsonschema.ValidationError):
        validate(no_listeners)


# ---- the pool and its picker agree --------------------------------------------------------------------

@pytest.mark.parametrize("kustomization", VARIANTS)
def test_the_pool_names_the_service_and_port_the_picker_serves(kustomization: str) -> None:
    pool = one(kustomization, "InferencePool")
    ref = pool["spec"]["endpointPickerRef"]
    assert ref.get("group", "") == "" and ref.get("kind", "Service") == "Service"
    assert ref["failureMode"] == "FailClose"
    (service,) = [s for s in by_kind(kustomization, "Service") if s["metadata"]["name"] == ref["name"]]
    assert service["metadata"]["namespace"] == pool["metadata"]["namespace"]
    (port,) = [p for p in service["spec"]["ports"] if p["port"] == ref["port"]["number"]]
    assert port["appProtocol"] == "http2"  # gRPC: the gateway must speak HTTP/2 to it
    deployment = one(kustomization, "Deployment")
    assert service["spec"]["selector"].items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    container_ports = {p["name"]: p["containerPort"] for p in picker(kustomization)["ports"]}
    listen_port = int(env_of(kustomization)["LOADAWARE_LISTEN"].rpartition(":")[2])
    assert container_ports[port["targetPort"]] == listen_port == ref["port"]["number"] == 9002


@pytest.mark.parametrize("kustomization", VARIANTS)
def test_the_picker_follows_this_pool(kustomization: str) -> None:
    pool = one(kustomization, "InferencePool")
    assert pool_spec(pool).label_selector == "app=vllm" and pool_spec(pool).ports == (8000,)
    env = env_of(kustomization)
    known = {s.env for s in SETTINGS}
    assert set(env) <= known, set(env) - known  # a misspelt variable would be silently ignored
    settings = resolve({}, env)  # accepted at start
    assert settings.discovery_mode == "inference-pool"
    assert settings.inference_pool == pool["metadata"]["name"]
    # no --k8s-namespace: the picker reads the pool in its own namespace, which is the pool's
    assert not settings.k8s_namespace
    assert one(kustomization, "Deployment")["metadata"]["namespace"] == pool["metadata"]["namespace"]
    assert env["LOADAWARE_METRICS_LISTEN"] == "0.0.0.0:9102"
    assert settings.destination_header == "x-gateway-destination-endpoint"  # the Endpoint Picker Protocol's


@pytest.mark.parametrize("kustomization", VARIANTS)
def test_probes_ask_the_grpc_health_names_the_sidecar_serves(kustomization: str) -> None:
    container = picker(kustomization)
    env = env_of(kustomization)
    grpc_port = int(env["LOADAWARE_LISTEN"].rpartition(":")[2])
    # the probes ask the ext_proc port, or the plain-text health port when the ext_proc port serves TLS
    # (kubelet's gRPC probes speak no TLS)
    health_port = int(env["LOADAWARE_HEALTH_LISTEN"].rpartition(":")[2]) if "LOADAWARE_HEALTH_LISTEN" in env \
        else grpc_port
    assert ("LOADAWARE_TLS_CERT" in env) == (health_port != grpc_port)
    readiness, liveness = container["readinessProbe"]["grpc"], container["livenessProbe"]["grpc"]
    # the Endpoint Picker Protocol's names, served by loadaware/extproc/health.py
    assert readiness == {"port": health_port, "service": "readiness"}
    assert readiness["service"] in READINESS_SERVICES
    assert liveness == {"port": health_port, "service": LIVENESS_SERVICE} and LIVENESS_SERVICE == "liveness"
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    expected = {"grpc": grpc_port, "metrics": 9102} | ({"health": health_port} if health_port != grpc_port else {})
    assert ports == expected
    security = container["securityContext"]
    assert security["runAsUser"] != 0 and security["readOnlyRootFilesystem"]
    assert not security["allowPrivilegeEscalation"] and security["capabilities"] == {"drop": ["ALL"]}
    pod = one(kustomization, "Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"]
    grace = float(env_of(kustomization)["LOADAWARE_SHUTDOWN_GRACE_S"])
    assert grace + container["lifecycle"]["preStop"]["sleep"]["seconds"] < pod["terminationGracePeriodSeconds"]
    assert container["image"] == "ghcr.io/example/loadaware-sidecar:0.1.0"


def test_gateways_that_dial_with_tls_get_a_tls_picker() -> None:
    """Envoy Gateway and kgateway connect to the picker with TLS: the picker serves it from a mounted Secret."""
    env = env_of("inference-pool/envoy-gateway")
    settings = resolve({}, env)
    assert settings.tls_cert == "/tls/tls.crt" and settings.tls_key == "/tls/tls.key"
    mounts = {m["name"]: m["mountPath"] for m in picker("inference-pool/envoy-gateway")["volumeMounts"]}
    volumes = {v["name"]: v for v in one("inference-pool/envoy-gateway", "Deployment")["spec"]["template"]["spec"]
               ["volumes"]}
    assert mounts["tls"] == "/tls" and volumes["tls"]["secret"]["secretName"] == "loadaware-picker-tls"
    assert "LOADAWARE_TLS_CERT" not in env_of("inference-pool/istio")  # Istio's mesh brings its own mTLS


@pytest.mark.parametrize("kustomization", VARIANTS)
def test_the_role_grants_what_inference_pool_discovery_calls(kustomization: str) -> None:
    role = one(kustomization, "Role")
    granted = {(group, resource): set(rule["verbs"]) for rule in role["rules"]
               for group in rule["apiGroups"] for resource in rule["resources"]}
    calls = API_CALLS + objectives.API_CALLS  # the pool and its pods; the InferenceObjectives (admission on)
    for group, resource, verbs in calls:
        assert set(verbs) <= granted.get((group, resource), set()), (group, resource, verbs)
    # and nothing beyond reading those resources: no writes, no secrets, no other kinds
    assert set(granted) == {(g, r) for g, r, _ in calls}
    assert all(verbs <= {"get", "list", "watch"} for verbs in granted.values())
    assert not by_kind(kustomization, "ClusterRole") and not by_kind(kustomization, "ClusterRoleBinding")
    binding = one(kustomization, "RoleBinding")
    account = one(kustomization, "ServiceAccount")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                  "name": role["metadata"]["name"]}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account["metadata"]["name"],
                                    "namespace": account["metadata"]["namespace"]}]
    pod = one(kustomization, "Deployment")["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == account["metadata"]["name"]


# ---- the example InferenceObjectives ---------------------------------------------------------------------

def test_the_example_objectives_validate_and_give_the_pools_priorities() -> None:
    docs = rendered(OBJECTIVES)
    assert {d["kind"] for d in docs} == {"InferenceObjective"}
    for doc in docs:
        validate(doc)  # against the CRD's schema (crd_schemas.py), not waved through
        assert (doc["apiVersion"], doc["kind"]) in SCHEMAS
    pool = one(POOL_ONLY, "InferencePool")
    assert {d["metadata"]["namespace"] for d in docs} == {pool["metadata"]["namespace"]}
    # what the picker of that pool folds them into
    folded = objectives.ObjectiveSet(pool["metadata"]["name"])
    folded.replace(docs)
    assert folded.priorities() == {"critical": 10, "standard": 0, "batch": -1} and not folded.skipped
    broken = copy.deepcopy(docs[0])
    broken["spec"]["priority"] = "high"
    with pytest.raises(jsonschema.ValidationError):
        validate(broken)
    del broken["spec"]["priority"], broken["spec"]["poolRef"]
    with pytest.raises(jsonschema.ValidationError):  # the pool it applies to is required
        validate(broken)


# ---- the route and the gateway ------------------------------------------------------------------------

@pytest.mark.parametrize("kustomization", VARIANTS)
def test_the_route_sends_to_the_pool(kustomization: str) -> None:
    route = one(kustomization, "HTTPRoute")
    pool = one(kustomization, "InferencePool")
    (rule,) = route["spec"]["rules"]
    assert rule["backendRefs"] == [{"group": INFERENCE_GROUP, "kind": "InferencePool",
                                    "name": pool["metadata"]["name"]}]  # same namespace, no port: the pool's
    assert route["metadata"]["namespace"] == pool["metadata"]["namespace"]
    assert rule["matches"] == [{"path": {"type": "PathPrefix", "value": "/"}}]
    (parent,) = route["spec"]["parentRefs"]
    assert (parent["group"], parent["kind"], parent["name"]) == ("gateway.networking.k8s.io", "Gateway",
                                                                 "inference-gateway")


@pytest.mark.parametrize(("kustomization", "gateway_class"), GATEWAYS.items())
def test_each_gateway_variant_brings_the_routes_parent(kustomization: str, gateway_class: str) -> None:
    gateway = one(kustomization, "Gateway")
    route = one(kustomization, "HTTPRoute")
    (parent,) = route["spec"]["parentRefs"]
    assert gateway["metadata"]["name"] == parent["name"]
    # the route attaches: same namespace, and an HTTP listener (allowedRoutes defaults to the same namespace)
    assert gateway["metadata"]["namespace"] == route["metadata"]["namespace"]
    assert [(lst["protocol"], lst.get("allowedRoutes", {}).get("namespaces", {}).get("from", "Same"))
            for lst in gateway["spec"]["listeners"]] == [("HTTP", "Same")]
    assert gateway["spec"]["gatewayClassName"] == gateway_class
    classes = by_kind(kustomization, "GatewayClass")
    if gateway_class == "istio":
        assert not classes  # istiod creates the `istio` class itself
    else:
        (gateway_class_doc,) = classes
        assert gateway_class_doc["metadata"] == {"name": gateway_class}  # cluster-scoped: no namespace
        assert gateway_class_doc["spec"]["controllerName"] == "gateway.envoyproxy.io/gatewayclass-controller"
    assert not by_kind(kustomization, "EnvoyFilter")  # the gateway writes ext_proc and override-host itself


def test_every_variant_runs_the_same_pool_and_picker() -> None:
    for kustomization in GATEWAYS:
        for kind in ("InferencePool", "Service", "Role", "HTTPRoute"):
            assert by_kind(kustomization, kind) == by_kind(POOL_ONLY, kind), (kustomization, kind)
    # the picker Deployment differs only where a gateway dials it with TLS (env, the Secret, the probe port)
    assert by_kind("inference-pool/istio", "Deployment") == by_kind(POOL_ONLY, "Deployment")
    tls_env = {"LOADAWARE_TLS_CERT", "LOADAWARE_TLS_KEY", "LOADAWARE_HEALTH_LISTEN"}
    assert set(env_of("inference-pool/envoy-gateway")) - set(env_of(POOL_ONLY)) == tls_env
    assert {k: v for k, v in env_of("inference-pool/envoy-gateway").items() if k not in tls_env} == env_of(POOL_ONLY)
    assert not by_kind(POOL_ONLY, "Gateway")  # pool alone: for a Gateway `inference-gateway` already running
    # the NetworkPolicy differs only where Envoy Gateway's proxies (in their own namespace) are admitted too
    assert by_kind("inference-pool/istio", "NetworkPolicy") == by_kind(POOL_ONLY, "NetworkPolicy")
    pool_policy, eg_policy = one(POOL_ONLY, "NetworkPolicy"), copy.deepcopy(one("inference-pool/envoy-gateway",
                                                                                "NetworkPolicy"))
    extra = eg_policy["spec"]["ingress"][0]["from"][1:]
    del eg_policy["spec"]["ingress"][0]["from"][1:]
    assert eg_policy == pool_policy and len(extra) == 2
