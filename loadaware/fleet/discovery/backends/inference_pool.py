"""`inference-pool`: the sidecar as a Gateway API Inference Extension endpoint picker; the fleet is the
InferencePool's pods (discovery/inference_pool.py)."""

from __future__ import annotations

from dataclasses import dataclass

from loadaware.fleet.discovery.spec import Backend, DiscoveryContext, Task


@dataclass(frozen=True)
class InferencePoolOptions:
    k8s_namespace: str = ""  # "": the pod's own
    inference_pool: str = ""
    kubeconfig: str = ""


def _build(o: InferencePoolOptions, context: DiscoveryContext) -> list[tuple[str, Task]]:
    from loadaware.fleet.discovery.inference_pool import InferencePoolDiscovery
    from loadaware.fleet.discovery.kubernetes import default_namespace, make_api_client

    source = InferencePoolDiscovery(o.k8s_namespace or default_namespace(), o.inference_pool, context.catalog,
                                    context.metrics, lambda: make_api_client(o.kubeconfig))
    return [("discovery-inference-pool", source.run)]


def _check(o: InferencePoolOptions) -> str | None:
    return None if o.inference_pool else \
        "--inference-pool: --discovery inference-pool needs the InferencePool's name"


INFERENCE_POOL = Backend("inference-pool", _build, InferencePoolOptions, finds_endpoints=True, in_cluster=True,
                         check=_check)
