"""Operating points of the real-time experiment: fleet size, engine service model, workload shape.

- `reference`: the reference experiment as published (experiment/README.md): 2 engines, 128 prefixes,
  Zipf 0.9, 1,578-token prompts, Poisson 16 req/s, 500 requests per seed, 64 output tokens; the engines run
  the calibrated service model.
- `queueing`: the second operating point, where the fleet queues and placement can cut latency:
  `experiment.calibration.QUEUEING_*` (4 engines at 40 req/s, 10 per engine against 8 at the reference
  point), the DES's second point, so both modes run the same point.
- `tiny`: 2 engines, a few seconds of traffic: the CI test and smoke runs.
- `agentic`: agent sessions (experiment.agentic: growing contexts, tool pauses, sub-agents, 40% on the
  Responses API with `previous_response_id`), closed loop, on 4 calibrated engines (`agentic_point`).
- `h015`: a workload no policy was designed on, the scenario generator's held-out draw h015
  (`experiment.scenarios`): 6 equal engines, bursty (gamma, CV 3) arrivals at 0.77 of the estimated capacity,
  111 prefixes at Zipf 0.20, 1,779-token prefixes and 1,092-token unique suffixes, 38 output tokens; 500
  measured requests.

The service model is whatever `experiment.calibration` states (one place for the fitted numbers); if that
module is absent (an old checkout) the simulator's defaults are used and the run says so in its config.
"""

from __future__ import annotations

import importlib
from dataclasses import asdict, dataclass, replace
from typing import Any

from experiment.agentic import AgenticSpec
from experiment.workload import WorkloadSpec
from sim.service_model import ServiceModel


@dataclass(frozen=True)
class OperatingPoint:
    name: str
    engines: int
    workload: WorkloadSpec
    service: ServiceModel
    source: str  # where the service model came from (calibration, or defaults)
    # Closed-loop agent sessions (experiment.agentic) instead of `workload`'s open-loop requests (which then only
    # names the model and sizes the driver's bookkeeping); None: the open-loop workload.
    agentic: AgenticSpec | None = None

    def describe(self) -> dict[str, Any]:
        out = {"name": self.name, "engines": self.engines, "workload": asdict(self.workload),
               "service": asdict(self.service), "service_source": self.source}
        if self.agentic is not None:
            out["agentic"] = asdict(self.agentic)
        return out


def _calibration() -> Any | None:
    try:
        return importlib.import_module("experiment.calibration")
    except ImportError:
        return None


def _calibrated(attr: str) -> tuple[ServiceModel, str] | None:
    cal = _calibration()
    value = getattr(cal, attr, None) if cal is not None else None
    return (value, f"experiment.calibration.{attr}") if isinstance(value, ServiceModel) else None


def reference_point() -> OperatingPoint:
    found = _calibrated("CALIBRATED")
    svc, source = found or (ServiceModel(), "sim.service_model defaults (no experiment.calibration)")
    return OperatingPoint("reference", 2, WorkloadSpec(), svc, source)


def queueing_point() -> OperatingPoint:
    """experiment.calibration's QUEUEING_* point; without it, the reference's on 4 engines at 40 req/s."""
    cal = _calibration()
    ref = reference_point()
    svc, source = _calibrated("QUEUEING_SERVICE") or (ref.service, ref.source)
    engines = int(getattr(cal, "QUEUEING_ENGINES", 4))
    workload = getattr(cal, "QUEUEING_WORKLOAD", None)
    if not isinstance(workload, WorkloadSpec):
        workload = replace(ref.workload, rate=40.0)
    return OperatingPoint("queueing", engines, workload, svc, source)


def tiny_point() -> OperatingPoint:
    """CI-sized: 2 engines, 16 prefixes, ~4 s of traffic, short prompts, fast engines."""
    wl = WorkloadSpec(n_prefixes=16, prefix_tokens=520, suffix_tokens=24, rate=8.0, n_requests=24,
                      max_tokens=8, warmup_passes=1, warmup_rate=16.0)
    return OperatingPoint("tiny", 2, wl, ServiceModel(), "sim.service_model defaults (tiny CI point)")


def held_out_point(index: int = 15) -> OperatingPoint:
    """A held-out draw of the scenario generator with equal engines (the real-time fleet runs one service model)."""
    from experiment.scenarios import draw

    d = draw("held-out", index)
    fleet = d.point.point.fleet
    if any(fleet.service_of(i) != fleet.service for i in range(fleet.engines)):
        raise ValueError(f"{d.name}: mixed engine speeds; the real-time fleet runs one service model")
    spec = replace(d.point.point.spec, n_requests=500)
    return OperatingPoint(d.name, fleet.engines, spec, fleet.service, f"experiment.scenarios draw {d.name}")


def agentic_point() -> OperatingPoint:
    """Agent sessions (experiment.agentic) on 4 calibrated engines, sized for a ~2-minute run on this machine:
    16 root sessions at 0.4/s, 3-8 turns, replies of 16-64 tokens (every streamed token costs the 2 cores)."""
    ref = reference_point()
    spec = AgenticSpec(root_sessions=16, session_rate=0.4, turns=(3, 8), output_tokens=(16, 64))
    workload = replace(ref.workload, n_requests=spec.root_sessions, warmup_passes=0)
    return OperatingPoint("agentic", 4, workload, ref.service, ref.source, agentic=spec)


POINTS = {"reference": reference_point, "queueing": queueing_point, "tiny": tiny_point, "h015": held_out_point,
          "agentic": agentic_point}


def point_by_name(name: str, **workload_overrides: Any) -> OperatingPoint:
    if name not in POINTS:
        raise ValueError(f"unknown operating point {name!r}; known: {', '.join(POINTS)}")
    p = POINTS[name]()
    overrides = {k: v for k, v in workload_overrides.items() if v is not None}
    engines = overrides.pop("engines", None)
    if overrides:
        p = replace(p, workload=replace(p.workload, **overrides))
    if engines is not None:
        p = replace(p, engines=int(engines))
    return p
