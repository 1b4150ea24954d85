"""`kubernetes`: the fleet is a Service's EndpointSlices, listed then watched (discovery/kubernetes.py)."""

from __future__ import annotations

from dataclasses import dataclass

from loadaware.fleet.discovery.spec import Backend, DiscoveryContext, Task


@dataclass(frozen=True)
class KubernetesOptions:
    k8s_namespace: str = ""  # "": the pod's own
    k8s_service: str = ""
    k8s_port_name: str = ""
    kubeconfig: str = ""


def _build(o: KubernetesOptions, context: DiscoveryContext) -> list[tuple[str, Task]]:
    from loadaware.fleet.discovery.kubernetes import (
        KubernetesDiscovery,
        ServiceRef,
        default_namespace,
        make_api_client,
    )

    service = ServiceRef(o.k8s_namespace or default_namespace(), o.k8s_service, o.k8s_port_name)
    source = KubernetesDiscovery(service, context.catalog, context.metrics, lambda: make_api_client(o.kubeconfig))
    return [("discovery-kubernetes", source.run)]


def _check(o: KubernetesOptions) -> str | None:
    return None if o.k8s_service else "--k8s-service: --discovery kubernetes needs the engines' Service name"


KUBERNETES = Backend("kubernetes", _build, KubernetesOptions, finds_endpoints=True, in_cluster=True, check=_check)
