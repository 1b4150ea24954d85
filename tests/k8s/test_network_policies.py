"""Who may reach which port of the sidecar, in every variant (issue 13: a prefix-cache-aware router can tell
whether a prompt was recently served, so its debug API must not be reachable by other tenants):

- ext_proc: only the gateway. Beside Envoy in the gateway's pod (base, inject, Istio) it listens on the pod's
  loopback, so nothing outside the pod reaches it and no rule mentions it; as an InferencePool's picker (its
  own pod) the NetworkPolicy admits the gateway's proxies and nobody else;
- /metrics: the monitoring namespace only;
- the admin listeners (debug API, reflection, /debug): loopback, in no container port, Service or rule:
  reachable with `kubectl port-forward` only;
- the health port kubelet probes: in no rule (traffic from the node is always allowed).

Rendered with `kubectl kustomize` and validated against the Kubernetes schemas (NetworkPolicy is a core
object) like every other manifest (test_manifests.py renders them; here also their contents)."""

from __future__ import annotations

import copy
from typing import Any

import kubernetes_validate
import pytest

from loadaware.api.admin import is_loopback
from loadaware.config import Settings, resolve

from .test_manifests import rendered, validate

MONITORING = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
GATEWAY_POD = ("base", "overlays/inject", "istio")  # the sidecar beside Envoy in the gateway's pod
PICKER = ("inference-pool", "inference-pool/istio", "inference-pool/envoy-gateway")  # the picker's own pod
VARIANTS = (*GATEWAY_POD, *PICKER)
# The gateway's own client-facing ports in each variant, the only ones open to anyone.
PUBLIC_PORTS = {"base": {8080}, "overlays/inject": {8080}, "istio": {8080, 15021}}
GATEWAY_NAME = {"podSelector": {"matchLabels": {"gateway.networking.k8s.io/gateway-name": "inference-gateway"}}}
ENVOY_GATEWAY_OWNER = {"gateway.envoyproxy.io/owning-gateway-name": "inference-gateway",
                       "gateway.envoyproxy.io/owning-gateway-namespace": "llm"}


def by_kind(kustomization: str, kind: str) -> list[dict[str, Any]]:
    return [d for d in rendered(kustomization) if d["kind"] == kind]


def policy(kustomization: str) -> dict[str, Any]:
    (doc,) = by_kind(kustomization, "NetworkPolicy")
    return doc


def pod(kustomization: str) -> dict[str, Any]:
    (deployment,) = by_kind(kustomization, "Deployment")
    return dict(deployment["spec"]["template"])


def sidecar(kustomization: str) -> dict[str, Any]:
    return next(c for c in pod(kustomization)["spec"]["containers"] if c["name"] == "loadaware-sidecar")


def settings(kustomization: str) -> Settings:
    return resolve({}, {e["name"]: e["value"] for e in sidecar(kustomization)["env"]})


def port_of(address: str) -> int:
    return int(address.rpartition(":")[2])


def peers(kustomization: str, port: int) -> list[dict[str, Any]] | None:
    """Who the policy lets reach `port`: None = anyone (a rule without `from`), else the union of peers."""
    out: list[dict[str, Any]] = []
    for rule in policy(kustomization)["spec"].get("ingress", []):
        if not any(p["port"] == port for p in rule["ports"]):
            continue
        if "from" not in rule:
            return None
        out += rule["from"]
    return out


@pytest.mark.parametrize("kustomization", VARIANTS)
def test_one_ingress_policy_selects_the_pod_that_runs_the_sidecar(kustomization: str) -> None:
    doc = policy(kustomization)
    validate(doc)
    spec = doc["spec"]
    assert spec["policyTypes"] == ["Ingress"]
    labels = pod(kustomization)["metadata"]["labels"]
    assert spec["podSelector"]["matchLabels"].items() <= labels.items() and spec["podSelector"]["matchLabels"]
    (deployment,) = by_kind(kustomization, "Deployment")
    assert doc["metadata"]["namespace"] == deployment["metadata"]["namespace"]
    for rule in spec["ingress"]:
        # every rule names its ports (a rule without ports opens all of them), as numbers over TCP
        assert rule["ports"] and all(isinstance(p["port"], int) and p["protocol"] == "TCP" for p in rule["ports"])
        for peer in rule.get("from", []):
            assert set(peer) <= {"namespaceSelector", "podSelector"}  # pods and namespaces, never address ranges
            # no empty selector: `{}` means every namespace, or every pod of one
            assert all(selector.get("matchLabels") for selector in peer.values()), peer


@pytest.mark.parametrize("kustomization", GATEWAY_POD)
def test_beside_envoy_ext_proc_is_loopback_and_in_no_rule(kustomization: str) -> None:
    s = settings(kustomization)
    assert is_loopback(s.listen)  # only this pod's Envoy calls it
    extproc = port_of(s.listen)
    assert peers(kustomization, extproc) == []
    assert extproc not in {p["containerPort"] for c in pod(kustomization)["spec"]["containers"]
                           for p in c.get("ports", [])}
    # kubelet's probes come to the pod ip: the plain-text health port (health only), in no rule either
    health = port_of(s.health_listen)
    assert not is_loopback(s.health_listen) and sidecar(kustomization)["readinessProbe"]["grpc"]["port"] == health
    assert peers(kustomization, health) == []


@pytest.mark.parametrize("kustomization", PICKER)
def test_only_the_gateways_proxies_reach_the_pickers_ext_proc_port(kustomization: str) -> None:
    s = settings(kustomization)
    extproc = port_of(s.listen)
    assert s.listen == f"0.0.0.0:{extproc}"  # the gateway connects through the Service
    (pool,) = by_kind(kustomization, "InferencePool")
    assert pool["spec"]["endpointPickerRef"]["port"]["number"] == extproc
    allowed = peers(kustomization, extproc)
    assert allowed is not None and allowed[0] == GATEWAY_NAME  # Istio's and kgateway's proxies of the Gateway
    # every peer is a pod of the Gateway `inference-gateway`, selected by the labels its controller sets
    for peer in allowed:
        selected = peer["podSelector"]["matchLabels"]
        assert selected in (GATEWAY_NAME["podSelector"]["matchLabels"], ENVOY_GATEWAY_OWNER)
        assert "namespaceSelector" not in peer or \
            peer["namespaceSelector"] == {"matchLabels": {"kubernetes.io/metadata.name": "envoy-gateway-system"}}
    if kustomization.endswith("envoy-gateway"):  # its proxies run in its own namespace (or the Gateway's)
        assert {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "envoy-gateway-system"}},
                "podSelector": {"matchLabels": ENVOY_GATEWAY_OWNER}} in allowed
        assert {"podSelector": {"matchLabels": ENVOY_GATEWAY_OWNER}} in allowed
        # with TLS on ext_proc, kubelet probes the plain-text health port, in no rule
        assert peers(kustomization, port_of(s.health_listen)) == []
    else:
        assert allowed == [GATEWAY_NAME]
    # the pool's Gateway is the one these proxies belong to (when the variant brings it)
    for gateway in by_kind(kustomization, "Gateway"):
        assert gateway["metadata"]["name"] == "inference-gateway" and gateway["metadata"]["namespace"] == "llm"


@pytest.mark.parametrize("kustomization", VARIANTS)
def test_only_the_monitoring_namespace_reaches_metrics(kustomization: str) -> None:
    s = settings(kustomization)
    metrics = port_of(s.metrics_listen)
    assert peers(kustomization, metrics) == [MONITORING]
    assert {"name": "metrics", "containerPort": metrics, "protocol": "TCP"} in sidecar(kustomization)["ports"]
    # nothing else is open to everyone but the gateway's own client port(s); everything else is monitoring's
    open_to_all = {p["port"] for r in policy(kustomization)["spec"]["ingress"] if "from" not in r for p in r["ports"]}
    assert open_to_all == PUBLIC_PORTS.get(kustomization, set())
    for rule in policy(kustomization)["spec"]["ingress"]:
        if "from" in rule and rule["from"] == [MONITORING]:
            assert metrics in {p["port"] for p in rule["ports"]}


@pytest.mark.parametrize("kustomization", VARIANTS)
def test_the_admin_listeners_are_loopback_and_exposed_nowhere(kustomization: str) -> None:
    s = settings(kustomization)
    assert s.admin_listen and s.admin_http_listen  # on: kubectl port-forward reaches loopback in the pod
    assert is_loopback(s.admin_listen) and is_loopback(s.admin_http_listen)
    assert s.origins["admin_listen"] == s.origins["admin_http_listen"] == "env"  # said in the manifest
    admin = {port_of(s.admin_listen), port_of(s.admin_http_listen)}
    declared = {p["containerPort"] for c in pod(kustomization)["spec"]["containers"] for p in c.get("ports", [])}
    assert not admin & declared
    for service in by_kind(kustomization, "Service"):
        for p in service["spec"]["ports"]:
            assert p["port"] not in admin and p.get("targetPort") not in admin
            assert p.get("targetPort") not in {"admin", "admin-http"}
    for port in admin:
        assert peers(kustomization, port) == []


def test_the_picker_service_exposes_ext_proc_and_metrics_only() -> None:
    for kustomization in PICKER:
        (service,) = [s for s in by_kind(kustomization, "Service") if s["metadata"]["name"] == "loadaware-picker"]
        assert {p["name"]: p["port"] for p in service["spec"]["ports"]} == {"grpc": 9002, "metrics": 9102}
    (service,) = [s for s in by_kind("base", "Service") if s["metadata"]["name"] == "loadaware-gateway"]
    assert [p["name"] for p in service["spec"]["ports"]] == ["http"]  # the gateway's clients, nothing of ours


def test_validation_really_rejects_a_broken_policy() -> None:
    doc = policy("base")
    for mistake in (
        lambda d: d["spec"]["ingress"][1]["from"][0].update(namespaceSelctor={}),  # a typo is an unknown field
        lambda d: d["spec"]["ingress"][0]["ports"][0].update(port=[8080]),  # a port is a number or a name
        lambda d: d["spec"].update(podSelector="loadaware-gateway"),
    ):
        broken = copy.deepcopy(doc)
        mistake(broken)
        with pytest.raises(kubernetes_validate.ValidationError):
            validate(broken)
