"""A companion of the cluster backends: admission's priorities from the namespace's InferenceObjectives, over
the file's (discovery/objectives.py). An optional task (not discovery-*): failing, it keeps the last
priorities and never touches readiness."""

from __future__ import annotations

from dataclasses import dataclass

from loadaware.fleet.discovery.spec import Backend, DiscoveryContext, Task


@dataclass(frozen=True)
class ObjectivesOptions:
    objectives_from_cluster: bool = False  # admission on, a cluster backend, the watch not refused
    k8s_namespace: str = ""  # "": the pod's own
    inference_pool: str = ""  # "": every objective of the namespace
    kubeconfig: str = ""


def _build(o: ObjectivesOptions, context: DiscoveryContext) -> list[tuple[str, Task]]:
    from loadaware.fleet.discovery.kubernetes import default_namespace, make_api_client
    from loadaware.fleet.discovery.objectives import InferenceObjectivesWatch

    if context.set_objectives is None:
        return []  # admission is off: nobody reads priorities
    watch = InferenceObjectivesWatch(o.k8s_namespace or default_namespace(), o.inference_pool,
                                     context.set_objectives, context.metrics, lambda: make_api_client(o.kubeconfig))
    return [(watch.name, watch.run)]


OBJECTIVES = Backend("inference-objectives", _build, ObjectivesOptions, mode=False,
                     wanted=lambda o: bool(o.objectives_from_cluster))
