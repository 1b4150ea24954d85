"""The research arms, registered into the simulator's arm registry (`experiment.arms`) when this module is
imported: `predictive` (research/predictive.py), `lane` (the sidecar's former `lane` policy,
loadaware/policies/lane.py, which `lane-spread` builds on) and the variants of research/variants.py. The product
no longer offers any of them; they are kept because research/notebook.md cites their runs.

    from research.arms import arm_by_name    # the registry's lookup, with the research arms registered
    python -m research grid --ours predictive --credit gpu    # an experiment command with them (research/__main__.py)
"""

from __future__ import annotations

from experiment.arms import Arm, register
from experiment.arms import arm_by_name as arm_by_name
from loadaware.policies.lane import Lane
from research.predictive import Predictive
from research.variants import NOTHING, TTFT_MODELS, VARIANT_ARMS

RESEARCH_ARMS: tuple[Arm, ...] = (
    Arm("predictive", "predictive", factory=Predictive, reads=TTFT_MODELS),
    Arm("lane", "lane", factory=Lane, reads=NOTHING),
    *VARIANT_ARMS,
)
register(*RESEARCH_ARMS)
