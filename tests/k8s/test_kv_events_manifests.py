"""The two KV-event deployments (k8s/kv-events/): they render and validate, and the engines' vLLM
--kv-events-config agrees with the sidecar's settings, Services and NetworkPolicies on every port."""

from __future__ import annotations

import json
from typing import Any

import pytest

from loadaware.config import resolve
from loadaware.prefix.kvevents.inbound import convention_ip

from .test_manifests import rendered, validate

BIND, CONNECT = "kv-events/engines-bind", "kv-events/engines-connect"


def deployment(kustomization: str, name: str) -> dict[str, Any]:
    return next(d for d in rendered(kustomization) if d["kind"] == "Deployment" and d["metadata"]["name"] == name)


def sidecar_env(kustomization: str, deployment_name: str) -> dict[str, str]:
    pod = deployment(kustomization, deployment_name)["spec"]["template"]["spec"]
    sidecar = next(c for c in pod["containers"] if c["name"] == "loadaware-sidecar")
    return {e["name"]: e["value"] for e in sidecar["env"]}


def vllm_kv_config(kustomization: str) -> dict[str, Any]:
    engine = deployment(kustomization, "vllm")["spec"]["template"]["spec"]["containers"][0]
    (arg,) = [a for a in engine["args"] if a.startswith("--kv-events-config=")]
    config: dict[str, Any] = json.loads(arg.partition("=")[2])
    return config


def ingress_ports(kustomization: str, policy: str, peer_label: dict[str, str]) -> set[int]:
    doc = next(d for d in rendered(kustomization) if d["kind"] == "NetworkPolicy" and d["metadata"]["name"] == policy)
    return {p["port"] for rule in doc["spec"]["ingress"] for peer in rule["from"]
            if peer.get("podSelector", {}).get("matchLabels") == peer_label for p in rule["ports"]}


@pytest.mark.parametrize("kustomization", [BIND, CONNECT])
def test_renders_and_validates(kustomization: str) -> None:
    docs = rendered(kustomization)
    for doc in docs:
        validate(doc)
        assert doc["metadata"].get("namespace", "llm") == "llm"


def test_engines_bind_ports_agree() -> None:
    env = sidecar_env(BIND, "loadaware-gateway")
    settings = resolve({}, env)
    assert settings.prefix_sources == ("kv-events",) and not settings.kv_events_bind
    config = vllm_kv_config(BIND)
    assert config["endpoint"] == f"tcp://*:{settings.kv_events_port}"  # `*`: vLLM binds, the sidecar dials
    assert config["replay_endpoint"] == f"tcp://*:{settings.kv_events_replay_port}"
    gateway = {"app.kubernetes.io/name": "loadaware-gateway"}
    assert {8000, settings.kv_events_port, settings.kv_events_replay_port} <= ingress_ports(BIND, "vllm", gateway)


def test_engines_connect_ports_agree() -> None:
    env = sidecar_env(CONNECT, "loadaware-picker")
    settings = resolve({}, env)
    assert settings.prefix_sources == ("kv-events",)
    bind_port = int(settings.kv_events_bind.rpartition(":")[2])
    service = next(d for d in rendered(CONNECT) if d["kind"] == "Service"
                   and d["metadata"]["name"] == "loadaware-picker-kv-events")
    (port,) = service["spec"]["ports"]
    picker = deployment(CONNECT, "loadaware-picker")
    assert picker["spec"]["replicas"] == 1  # an engine connects to one address: one picker sees them all
    container_ports = {p["name"]: p["containerPort"] for p in picker["spec"]["template"]["spec"]["containers"][0]
                       ["ports"]}
    assert container_ports[port["targetPort"]] == bind_port
    config = vllm_kv_config(CONNECT)
    # No `*` or `::`: vLLM connects to the picker's Service.
    assert config["endpoint"] == f"tcp://loadaware-picker-kv-events.llm.svc.cluster.local:{port['port']}"
    assert "*" not in config["endpoint"] and "::" not in config["endpoint"]
    assert config["replay_endpoint"] == f"tcp://*:{settings.kv_events_replay_port}"
    assert convention_ip(config["topic"].replace("$(POD_IP)", "10.0.0.7")) == "10.0.0.7"
    engine = deployment(CONNECT, "vllm")["spec"]["template"]["spec"]["containers"][0]
    assert {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}} in engine["env"]
    vllm_pods = {"app.kubernetes.io/name": "vllm"}
    assert ingress_ports(CONNECT, "loadaware-picker-kv-events", vllm_pods) == {bind_port}
    picker_pods = {"app.kubernetes.io/name": "loadaware-picker"}
    assert {8000, settings.kv_events_replay_port} <= ingress_ports(CONNECT, "vllm", picker_pods)
