"""Every shipped manifest's sidecar container can hold the worst case of its configuration: the defaults, with
what the manifest's environment sets, every bound full at once (loadaware/memory_budget.py), within the share
of the container's memory limit the budget allows."""

from __future__ import annotations

import inspect
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from loadaware import memory_budget
from loadaware.config import Settings, resolve
from loadaware.memory_budget import Bounds, MiB, worst_case
from loadaware.telemetry.decisions import RecentDecisions
from loadaware.tokenize.pieces import MAX_CACHED_TOKENS

K8S = Path(__file__).resolve().parents[2] / "k8s"
SIDECAR_IMAGE = "loadaware-sidecar"
UNITS = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40, "k": 10**3, "M": 10**6, "G": 10**9, "": 1}


def quantity_bytes(text: str) -> int:
    """A Kubernetes memory quantity ("1536Mi", "2G", "1073741824") in bytes."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|k|M|G)?", str(text).strip())
    if m is None:
        raise ValueError(f"not a memory quantity: {text!r}")
    return int(float(m.group(1)) * UNITS[m.group(2) or ""])


def containers(node: Any) -> Iterator[dict[str, Any]]:
    """Every container spec anywhere in a document (Deployments, patches, pod templates)."""
    if isinstance(node, dict):
        for c in node.get("containers") or ():
            if isinstance(c, dict):
                yield c
        for value in node.values():
            yield from containers(value)
    elif isinstance(node, list):
        for value in node:
            yield from containers(value)


def sidecars() -> list[tuple[str, dict[str, Any]]]:
    found = []
    for path in sorted(K8S.rglob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            for c in containers(doc):
                if str(c.get("image", "")).split(":")[0].endswith(SIDECAR_IMAGE):
                    found.append((f"{path.relative_to(K8S)}:{c.get('name')}", c))
    return found


SIDECARS = sidecars()


def settings_of(container: dict[str, Any]) -> Settings:
    """The sidecar's settings as that container runs it: its literal env over the defaults (no flags: the
    manifests pass `serve` alone)."""
    env = {e["name"]: str(e["value"]) for e in container.get("env") or () if "value" in e}
    return resolve({}, environ=env)


def bounds_of(settings: Settings) -> Bounds:
    ring = inspect.signature(RecentDecisions).parameters["size"].default
    return Bounds(kv_events_max_blocks=settings.kv_events_max_blocks, approx_max_blocks=settings.approx_max_blocks,
                  piece_cache_tokens=settings.tokenizer_cache_tokens, recent_decisions=ring,
                  conversation_cache_bytes=settings.conversation_cache_mb * MiB,
                  state_max_entries=settings.state_max_entries, session_max_entries=settings.session_max_entries,
                  admission_held_bytes=settings.admission_max_held_bytes if settings.admission else 0,
                  admission_held=settings.admission_max_held if settings.admission else 0,
                  open_streams=settings.max_open_streams)


def test_every_sidecar_manifest_is_found() -> None:
    names = {name.split(":")[0] for name, _ in SIDECARS}
    assert {"base/deployment.yaml", "overlays/inject/sidecar-patch.yaml", "istio/gateway-deployment.yaml",
            "inference-pool/pool/picker-deployment.yaml"} <= names


@pytest.mark.parametrize(("name", "container"), SIDECARS, ids=[n for n, _ in SIDECARS])
def test_worst_case_fits_the_memory_limit(name: str, container: dict[str, Any]) -> None:
    limit = quantity_bytes(container["resources"]["limits"]["memory"])
    parts = worst_case(bounds_of(settings_of(container)))
    total = sum(parts.values())
    shown = ", ".join(f"{k} {v / MiB:.0f}" for k, v in parts.items())
    assert total <= memory_budget.LIMIT_SHARE * limit, (
        f"{name}: worst case {total / MiB:.0f} MiB > {memory_budget.LIMIT_SHARE:.0%} of the {limit / MiB:.0f} MiB "
        f"limit ({shown} MiB)")
    request = quantity_bytes(container["resources"]["requests"]["memory"])
    assert request <= limit


def test_every_sidecar_caps_its_open_streams() -> None:
    """Without the cap the requests in flight are not bounded (engines that stop answering pile them up until the
    route's time-out): no manifest may turn it off, and the budget counts the default."""
    assert Bounds(0, 0, 0, 0).open_streams == Settings().max_open_streams > 0
    for name, container in SIDECARS:
        assert settings_of(container).max_open_streams > 0, name


def test_the_old_kv_events_default_would_not_fit() -> None:
    """The check is not vacuous: the former default bound (4M blocks) breaks the shipped 1664Mi limit."""
    old = Bounds(kv_events_max_blocks=4_000_000, approx_max_blocks=Settings().approx_max_blocks,
                 piece_cache_tokens=MAX_CACHED_TOKENS, recent_decisions=256)
    assert sum(worst_case(old).values()) > memory_budget.LIMIT_SHARE * quantity_bytes("1664Mi")


def test_manifest_environment_overrides_enter_the_budget() -> None:
    container = {"env": [{"name": "LOADAWARE_KV_EVENTS_MAX_BLOCKS", "value": "9000000"}]}
    assert bounds_of(settings_of(container)).kv_events_max_blocks == 9_000_000


def test_quantities() -> None:
    assert quantity_bytes("1536Mi") == 1536 * MiB and quantity_bytes("1Gi") == 1 << 30
    assert quantity_bytes("2G") == 2 * 10**9 and quantity_bytes("1048576") == MiB
    with pytest.raises(ValueError):
        quantity_bytes("lots")
