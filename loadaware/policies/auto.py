"""`--policy auto`, the default: the policy for what this sidecar can see, chosen once at start.

It is the seed's `loadaware` (beta 1), with or without a tokenizer, fed by every prefix source the deployment
offers (with `--lmcache-url` and a tokenizer: LMCache and the sidecar's own record of where it sent each prefix,
loadaware/config.py `prefix_sources`).

How it was chosen: by a rule fixed before the held-out run of the scenario generator (experiment.scenarios):
`banded` (lane-spread within a band of loadaware's own choice, loadaware/policies/banded.py) would be the default
if it held the floor on the held-out draws in every configuration (no draw more than 10% worse than `loadaware`,
97% of them within 5%); otherwise `loadaware` is. `banded` missed it (its figures, and those of `lane-spread`,
the earlier default, are in docs/results.md), so the default does no harm first; both stay selectable.
"""

from __future__ import annotations

AUTO = "auto"
WITH_TOKENIZER = "loadaware"
WITHOUT_TOKENIZER = "loadaware"


def auto_policy(tokenizer: bool) -> tuple[str, str]:
    """(the policy, why) for a sidecar with or without a tokenizer."""
    why = ("auto: the seed's loadaware (beta 1), fed by every prefix source configured; the cleverer policies "
           "(banded, lane-spread) strayed from it by more than 10% on held-out draws")
    return (WITH_TOKENIZER if tokenizer else WITHOUT_TOKENIZER), why
