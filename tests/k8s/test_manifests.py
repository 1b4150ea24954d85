"""Every kustomization renders with a real `kubectl kustomize`; every manifest validates against the
Kubernetes schemas (kubernetes-validate) or, for custom resources, the CRDs' schemas; the ConfigMap's Envoy
config passes `envoy --mode validate` and serves its probes; the Istio EnvoyFilter's patches applied to a
representative Istio gateway config pass `envoy --mode validate`; the pieces agree with each other."""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
import sys
import urllib.request
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from loadaware.config import SETTINGS
from loadaware.extproc.health import LIVENESS_SERVICE
from loadaware.fleet.discovery.metrics import DiscoveryMetrics
from loadaware.telemetry.metrics import Metrics
from testkit.envoy import EnvoyProc
from testkit.ports import free_port

from . import envoyfilter
from .crd_schemas import SCHEMAS

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "k8s"
VENV_BIN = REPO / ".venv" / "bin"
KUSTOMIZATIONS = ("base", "overlays/inject", "istio")
K8S_VERSIONS = ("1.30.0", "1.37.0")  # oldest with every field used (preStop sleep), and the newest known
ENVOY = str(VENV_BIN / "envoy")


def tool(name: str) -> str:
    found = shutil.which(name, path=str(VENV_BIN)) or shutil.which(name)
    if not found:
        pytest.fail(f"{name} not installed: pip install -e '.[dev]'")
    return found


@cache
def rendered(kustomization: str) -> tuple[dict[str, Any], ...]:
    result = subprocess.run([tool("kubectl"), "kustomize", str(K8S / kustomization)], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return tuple(d for d in yaml.safe_load_all(result.stdout) if d)


def by_kind(kustomization: str, kind: str) -> list[dict[str, Any]]:
    return [d for d in rendered(kustomization) if d["kind"] == kind]


def container(kustomization: str, name: str) -> dict[str, Any]:
    (deployment,) = by_kind(kustomization, "Deployment")
    return next(c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == name)


def validate(doc: dict[str, Any]) -> None:
    schema = SCHEMAS.get((doc["apiVersion"], doc["kind"]))
    if schema is not None:
        jsonschema.validate(doc, schema)
        return
    for version in K8S_VERSIONS:
        kubernetes_validate.validate(doc, version, strict=True)


def envoy_validate(config: dict[str, Any] | str, tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    path.write_text(config if isinstance(config, str) else yaml.safe_dump(config, sort_keys=False))
    result = subprocess.run([ENVOY, "--mode", "validate", "-c", str(path), "--use-dynamic-base-id"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert f"configuration '{path}' OK" in result.stdout + result.stderr


# ---- render and validate ----------------------------------------------------------------------------

@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_kustomization_renders_and_every_resource_validates(kustomization: str) -> None:
    docs = rendered(kustomization)
    assert docs
    for doc in docs:
        validate(doc)


def test_every_manifest_file_validates_on_its_own() -> None:
    checked = 0
    for path in sorted(K8S.rglob("*.yaml")):
        if path.name in ("kustomization.yaml", "envoy.yaml") or path.name.endswith("-patch.yaml"):
            continue
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                validate(doc)
                checked += 1
    assert checked >= 14


def test_validation_really_rejects_mistakes() -> None:
    (deployment,) = by_kind("base", "Deployment")
    broken = copy.deepcopy(deployment)
    broken["spec"]["template"]["spec"]["containers"][1]["readinessProbe"]["grpc"]["port"] = "grpc"  # must be int
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(broken)
    (envoy_filter,) = by_kind("istio", "EnvoyFilter")
    typo = copy.deepcopy(envoy_filter)
    typo["spec"]["configPatches"][0]["patch"]["operation"] = "INSERT_BEFOR"
    with pytest.raises(jsonschema.ValidationError):
        validate(typo)


# ---- the Envoy config in the ConfigMap -------------------------------------------------------------

def test_configmap_envoy_config_is_generated_from_envoy_yaml() -> None:
    result = subprocess.run([sys.executable, str(K8S / "envoy_config.py"), "--check"], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr


def configmap_envoy_yaml() -> str:
    (configmap,) = by_kind("base", "ConfigMap")
    assert re.fullmatch(r"loadaware-envoy-[a-z0-9]{10}", configmap["metadata"]["name"])  # hash: changes roll pods
    (deployment,) = by_kind("base", "Deployment")
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    assert volumes["envoy-config"]["configMap"]["name"] == configmap["metadata"]["name"]
    return str(configmap["data"]["envoy.yaml"])


def test_configmap_envoy_config_passes_envoy_validate(tmp_path: Path) -> None:
    envoy_validate(configmap_envoy_yaml(), tmp_path, "configmap-envoy.yaml")


def test_configmap_envoy_serves_probes_and_the_alerted_stats(tmp_path: Path) -> None:
    """Run it (ports moved to free ones): /ready and /stats/prometheus answer on the probes port, and
    every Envoy metric the PrometheusRule alerts on exists."""
    config = yaml.safe_load(configmap_envoy_yaml())
    probes = free_port()
    for listener in config["static_resources"]["listeners"]:
        port = free_port() if listener["name"] != "probes" else probes
        listener["address"]["socket_address"].update(address="127.0.0.1", port_value=port)
    admin = free_port()
    config["admin"]["address"]["socket_address"]["port_value"] = admin
    for cluster in config["static_resources"]["clusters"]:
        if cluster["name"] == "envoy_admin":
            cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"][
                "socket_address"]["port_value"] = admin
        if cluster["name"] == "engines":  # no cluster DNS here
            cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"][
                "socket_address"]["address"] = "localhost"
    path = tmp_path / "envoy-run.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    with EnvoyProc(path, tmp_path):
        with urllib.request.urlopen(f"http://127.0.0.1:{probes}/ready", timeout=5) as resp:
            assert resp.status == 200 and resp.read().strip() == b"LIVE"
        with urllib.request.urlopen(f"http://127.0.0.1:{probes}/stats/prometheus", timeout=5) as resp:
            stats = resp.read().decode()
        with pytest.raises(urllib.error.HTTPError):  # nothing else of the admin API is exposed
            urllib.request.urlopen(f"http://127.0.0.1:{probes}/clusters", timeout=5)
    envoy_metrics = {m for m in alerted_metrics() if m.startswith("envoy_")}
    assert envoy_metrics
    for name in envoy_metrics:
        assert re.search(rf"^{name}\{{", stats, re.M), f"{name} not in Envoy's /stats/prometheus"


# ---- Istio ---------------------------------------------------------------------------------------------

def test_istio_envoyfilter_on_a_representative_gateway_passes_envoy_validate(tmp_path: Path) -> None:
    gateway = yaml.safe_load((Path(__file__).parent / "istio_gateway_bootstrap.yaml").read_text())
    envoy_validate(gateway, tmp_path, "istio-before.yaml")  # the representative config itself is valid
    (envoy_filter,) = by_kind("istio", "EnvoyFilter")
    patched = envoyfilter.apply(gateway, envoy_filter, context="GATEWAY")
    envoy_validate(patched, tmp_path, "istio-patched.yaml")
    hcm = patched["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    assert [f["name"] for f in hcm["http_filters"]] == [
        "envoy.filters.http.grpc_stats", "envoy.filters.http.fault", "envoy.filters.http.cors",
        "envoy.filters.http.header_mutation", "envoy.filters.http.buffer", "envoy.filters.http.ext_proc",
        "envoy.filters.http.router"]
    clusters = {c["name"]: c for c in patched["static_resources"]["clusters"]}
    engines = clusters["outbound|8000||vllm.llm.svc.cluster.local"]
    policy = engines["load_balancing_policy"]["policies"][0]["typed_extension_config"]
    assert policy["name"] == "envoy.load_balancing_policies.override_host"
    assert engines["type"] == "EDS" and engines["lb_policy"] == "LOAD_BALANCING_POLICY_CONFIG"
    assert clusters["loadaware_sidecar"]["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"][
        "address"]["socket_address"] == {"address": "127.0.0.1", "port_value": 9002}


def test_istio_locality_lb_would_be_refused_hence_the_destination_rule(tmp_path: Path) -> None:
    gateway = yaml.safe_load((Path(__file__).parent / "istio_gateway_bootstrap.yaml").read_text())
    engines = next(c for c in gateway["static_resources"]["clusters"] if c["name"].startswith("outbound|"))
    engines["common_lb_config"] = {"locality_weighted_lb_config": {}}  # Istio with locality LB on
    (envoy_filter,) = by_kind("istio", "EnvoyFilter")
    path = tmp_path / "istio-locality.yaml"
    path.write_text(yaml.safe_dump(envoyfilter.apply(gateway, envoy_filter), sort_keys=False))
    result = subprocess.run([ENVOY, "--mode", "validate", "-c", str(path), "--use-dynamic-base-id"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode != 0 and "locality_weighted_lb_config" in result.stdout + result.stderr
    (rule,) = by_kind("istio", "DestinationRule")
    merge = next(p for p in envoy_filter["spec"]["configPatches"] if p["patch"]["operation"] == "MERGE")
    assert rule["spec"]["host"] == merge["match"]["cluster"]["service"]
    assert rule["spec"]["trafficPolicy"]["loadBalancer"]["localityLbSetting"] == {"enabled": False}


def test_istio_pieces_agree() -> None:
    (envoy_filter,) = by_kind("istio", "EnvoyFilter")
    env = {e["name"]: e["value"] for e in container("istio", "loadaware-sidecar")["env"]}
    merge = next(p for p in envoy_filter["spec"]["configPatches"] if p["patch"]["operation"] == "MERGE")
    target = merge["match"]["cluster"]
    # the sidecar mirrors exactly the cluster the EnvoyFilter switches to override_host
    assert env["LOADAWARE_ENVOY_CLUSTER"] == f"outbound|{target['portNumber']}||{target['service']}"
    assert env["LOADAWARE_DISCOVERY"] == "envoy-admin" and env["LOADAWARE_ENVOY_ADMIN_URL"].endswith(":15000")
    (vs,) = by_kind("istio", "VirtualService")
    destination = vs["spec"]["http"][0]["route"][0]["destination"]
    assert (destination["host"], destination["port"]["number"]) == (target["service"], target["portNumber"])
    (deployment,) = by_kind("istio", "Deployment")
    assert envoy_filter["spec"]["workloadSelector"]["labels"].items() <= \
        deployment["spec"]["template"]["metadata"]["labels"].items()
    assert not by_kind("istio", "Role")  # envoy-admin discovery needs no Kubernetes API access


# ---- the pieces agree --------------------------------------------------------------------------------

def test_inject_overlay_adds_the_same_sidecar_and_keeps_the_gateway() -> None:
    assert container("overlays/inject", "loadaware-sidecar") == container("base", "loadaware-sidecar")
    (deployment,) = by_kind("overlays/inject", "Deployment")
    spec = deployment["spec"]["template"]["spec"]
    assert [c["name"] for c in spec["containers"]] == ["loadaware-sidecar", "envoy"]
    assert {v["name"] for v in spec["volumes"]} == {"config", "models"}  # merged by name, none lost
    assert spec["serviceAccountName"] == "loadaware-sidecar"
    assert container("overlays/inject", "envoy")["args"] == ["-c", "/etc/envoy/envoy.yaml"]
    assert by_kind("overlays/inject", "Role") and by_kind("overlays/inject", "RoleBinding")


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_sidecar_container_settings_are_real_and_probes_match(kustomization: str) -> None:
    sidecar = container(kustomization, "loadaware-sidecar")
    env = {e["name"]: e["value"] for e in sidecar["env"]}
    known = {s.env for s in SETTINGS}
    assert set(env) <= known, set(env) - known  # a misspelt variable would be silently ignored
    # the settings parse and the combination is accepted at start
    from loadaware.config import resolve
    settings = resolve({}, env)
    assert all(settings.origins[s.name] == "env" for s in SETTINGS if s.env in env)
    # ext_proc on the pod's loopback (only this pod's Envoy calls it); kubelet's gRPC probes, which come to
    # the pod ip, ask the plain-text health port, which serves grpc.health.v1 only
    assert settings.listen == "127.0.0.1:9002"
    health_port = int(settings.health_listen.rpartition(":")[2])
    assert settings.health_listen == f"0.0.0.0:{health_port}"
    assert sidecar["readinessProbe"]["grpc"] == {"port": health_port, "service": ""}
    assert sidecar["livenessProbe"]["grpc"] == {"port": health_port, "service": LIVENESS_SERVICE}
    ports = {p["name"]: p["containerPort"] for p in sidecar["ports"]}
    assert ports == {"health": health_port, "metrics": int(env["LOADAWARE_METRICS_LISTEN"].rpartition(":")[2])}
    assert sidecar["resources"]["requests"]["cpu"] and sidecar["resources"]["requests"]["memory"]
    security = sidecar["securityContext"]
    assert security["runAsUser"] != 0 and security["readOnlyRootFilesystem"]
    assert not security["allowPrivilegeEscalation"]
    assert float(env["LOADAWARE_SHUTDOWN_GRACE_S"]) + sidecar["lifecycle"]["preStop"]["sleep"]["seconds"] < \
        by_kind(kustomization, "Deployment")[0]["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]


def test_base_discovery_matches_the_engines_service_and_envoy() -> None:
    env = {e["name"]: e["value"] for e in container("base", "loadaware-sidecar")["env"]}
    services = {s["metadata"]["name"]: s for s in by_kind("base", "Service")}
    engines = services[env["LOADAWARE_K8S_SERVICE"]]
    assert engines["spec"]["clusterIP"] == "None"  # headless: Envoy's DNS sees pod ips, like the watch
    port = next(p for p in engines["spec"]["ports"] if p["name"] == env["LOADAWARE_K8S_PORT_NAME"])
    config = yaml.safe_load(configmap_envoy_yaml())
    cluster = next(c for c in config["static_resources"]["clusters"] if c["name"] == "engines")
    address = cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]["socket_address"]
    namespace = engines["metadata"]["namespace"]
    assert address == {"address": f"{engines['metadata']['name']}.{namespace}.svc.cluster.local",
                       "port_value": port["port"]}
    assert cluster["type"] == "STRICT_DNS"
    sidecar_cluster = next(c for c in config["static_resources"]["clusters"] if c["name"] == "loadaware_sidecar")
    assert sidecar_cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"][
        "socket_address"]["port_value"] == int(env["LOADAWARE_LISTEN"].rpartition(":")[2])


def test_rbac_is_least_privilege() -> None:
    (role,) = by_kind("base", "Role")
    assert role["rules"] == [{"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"],
                              "verbs": ["list", "watch"]}]
    assert not by_kind("base", "ClusterRole") and not by_kind("base", "ClusterRoleBinding")
    (binding,) = by_kind("base", "RoleBinding")
    (account,) = by_kind("base", "ServiceAccount")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account["metadata"]["name"],
                                    "namespace": account["metadata"]["namespace"]}]
    (deployment,) = by_kind("base", "Deployment")
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == account["metadata"]["name"]


def test_podmonitor_scrapes_named_ports() -> None:
    (monitor,) = by_kind("base", "PodMonitor")
    (deployment,) = by_kind("base", "Deployment")
    names = {p["name"] for c in deployment["spec"]["template"]["spec"]["containers"] for p in c["ports"]}
    assert {e["port"] for e in monitor["spec"]["podMetricsEndpoints"]} <= names
    assert monitor["spec"]["selector"]["matchLabels"].items() <= \
        deployment["spec"]["template"]["metadata"]["labels"].items()


def alerted_metrics() -> set[str]:
    (rule,) = by_kind("base", "PrometheusRule")
    exprs = " ".join(r["expr"] for g in rule["spec"]["groups"] for r in g["rules"])
    return set(re.findall(r"\b((?:loadaware|envoy)_[a-z_]+)\b", exprs))


def test_alerts_use_metrics_the_sidecar_exports() -> None:
    metrics = Metrics("loadaware")
    DiscoveryMetrics(metrics.registry)
    exported = {s.name for family in metrics.registry.collect() for s in family.samples} | \
        {family.name for family in metrics.registry.collect()}
    for name in (m for m in alerted_metrics() if m.startswith("loadaware_")):
        assert name in exported or name.removesuffix("_total") in exported, name
