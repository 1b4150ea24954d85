"""What one simulated engine serves, as vLLM's flags say it: `--served-model-name a b` (every name servable,
the first is the base) and `--lora-modules name=path` (adapters listed with the base as `parent`). Pure.

`python -m sim.fleet --models SPEC`: one spec per engine separated by `;` (a single spec applies to every
engine); a spec is `name[,alias...][+adapter[=path]...]`, e.g. `model-a;model-a;model-b,b-chat+b-sql=/loras/sql`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class EngineModels:
    names: tuple[str, ...]  # served model names; the first is the base (what responses and metrics name)
    loras: tuple[tuple[str, str], ...] = ()  # (adapter name, its path)

    @property
    def base(self) -> str:
        return self.names[0]

    def servable(self) -> frozenset[str]:
        return frozenset((*self.names, *(name for name, _ in self.loras)))

    def listing(self, max_model_len: int) -> dict[str, Any]:
        """The body of vLLM's `GET /v1/models`: one card per served name, then one per adapter."""
        cards: list[dict[str, Any]] = [{"id": name, "object": "model", "owned_by": "vllm", "root": self.base,
                                        "parent": None, "max_model_len": max_model_len} for name in self.names]
        cards += [{"id": name, "object": "model", "owned_by": "vllm", "root": path, "parent": self.base,
                   "max_model_len": max_model_len} for name, path in self.loras]
        return {"object": "list", "data": cards}


def parse_spec(text: str) -> EngineModels:
    names_part, *adapters = text.strip().split("+")
    names = tuple(n.strip() for n in names_part.split(",") if n.strip())
    if not names:
        raise ValueError(f"{text!r}: no model name")
    loras = []
    for adapter in adapters:
        name, _, path = adapter.strip().partition("=")
        if not name.strip():
            raise ValueError(f"{text!r}: an adapter without a name")
        loras.append((name.strip(), path.strip() or f"/loras/{name.strip()}"))
    return EngineModels(names, tuple(loras))


def parse_fleet_models(text: str, engines: int) -> list[EngineModels]:
    specs = [parse_spec(part) for part in text.split(";") if part.strip()]
    if len(specs) == 1:
        return specs * engines
    if len(specs) != engines:
        raise ValueError(f"{len(specs)} model specs for {engines} engines")
    return specs
