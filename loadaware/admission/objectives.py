"""An objective's priority, as the Gateway API Inference Extension defines it: a request names its objective in
`x-gateway-inference-objective`, an InferenceObjective resource of that name gives it a `priority` (an integer;
below 0 is sheddable). A request with no objective, or one nobody defined, has the default priority 0.

Outside Kubernetes the objectives come from a file (--objectives FILE), JSON or YAML:

    {"critical": {"priority": 10}, "standard": {"priority": 0}, "batch": {"priority": -1}}

On Kubernetes the InferenceObjective resources of the pool's namespace add to (and override) the file's.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from loadaware.fleet.discovery.objectives import (
    DEFAULT_PRIORITY,
    MAX_NAME_CHARS,
    MAX_OBJECTIVES,
    PRIORITY_RANGE,
    valid_priority,
)

__all__ = ["DEFAULT_PRIORITY", "MAX_OBJECTIVES", "PRIORITY_RANGE", "Objectives", "ObjectivesError",
           "load_objectives", "parse_objectives"]


class ObjectivesError(ValueError):
    """The objectives file is not what the format above says."""


def parse_objectives(data: Any, source: str = "objectives") -> dict[str, int]:
    """{objective: priority} from the decoded file; raises ObjectivesError naming what is wrong."""
    if not isinstance(data, Mapping):
        raise ObjectivesError(f"{source}: expected a mapping of objective name to {{priority: <int>}}")
    if len(data) > MAX_OBJECTIVES:
        raise ObjectivesError(f"{source}: more than {MAX_OBJECTIVES} objectives")
    out: dict[str, int] = {}
    for name, spec in data.items():
        if not isinstance(name, str) or not name or len(name) > MAX_NAME_CHARS:
            raise ObjectivesError(f"{source}: an objective's name must be a string of 1-{MAX_NAME_CHARS} characters")
        priority = spec.get("priority", DEFAULT_PRIORITY) if isinstance(spec, Mapping) else None
        if not valid_priority(priority):
            raise ObjectivesError(f"{source}: objective {name!r}: priority must be an integer in "
                                  f"{PRIORITY_RANGE[0]}..{PRIORITY_RANGE[1]}")
        out[name] = priority
    return out


def load_objectives(path: str) -> dict[str, int]:
    """The objectives file at `path` (JSON, else YAML)."""
    text = Path(path).read_text(encoding="utf-8")
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        import yaml  # the Kubernetes client's dependency; only a YAML file needs it

        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ObjectivesError(f"{path}: neither JSON nor YAML: {exc}") from exc
    return parse_objectives(data, path)


class Objectives:
    """The priorities in force: the file's, then the cluster's resources over them (replaced as a whole on each
    list or watch event, so a deleted resource's priority goes)."""

    def __init__(self, from_file: Mapping[str, int] | None = None) -> None:
        self._file = dict(from_file or {})
        self._cluster: dict[str, int] = {}
        self._merged = dict(self._file)

    def priority(self, objective: str) -> int:
        return self._merged.get(objective, DEFAULT_PRIORITY) if objective else DEFAULT_PRIORITY

    def set_cluster(self, priorities: Mapping[str, int]) -> None:
        self._cluster = dict(priorities)
        self._merged = {**self._file, **self._cluster}

    def top(self) -> int:
        """The highest priority in force (the default's when none is higher): the band slots are reserved for."""
        return max(DEFAULT_PRIORITY, *self._merged.values()) if self._merged else DEFAULT_PRIORITY

    def known(self) -> dict[str, int]:
        return dict(self._merged)
