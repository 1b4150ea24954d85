"""`--policy auto`, the default: the policy for what this sidecar can see, chosen once at start.

| the sidecar has   | policy        | why                                                                        |
|-------------------|---------------|----------------------------------------------------------------------------|
| a tokenizer       | `lane-spread` | its prices are per token, and its prompts, matches and KV capacities are  |
|                   |               | counted in the engines' own tokens                                         |
| no tokenizer      | `loadaware`   | the exact sources see no prompt and the approximate one counts text units: |
|                   |               | a price per token would be per guess; loadaware's match over prompt is a   |
|                   |               | ratio of two counts in one unit, whatever the unit                          |

On the configuration grid (docs/results.md) these are the configurations where each holds the floor (at most
5% worse than `loadaware`) in the most cells; without a tokenizer `lane-spread` lost it by up to 15x.
"""

from __future__ import annotations

AUTO = "auto"
WITH_TOKENIZER = "lane-spread"
WITHOUT_TOKENIZER = "loadaware"


def auto_policy(tokenizer: bool) -> tuple[str, str]:
    """(the policy, why) for a sidecar with or without a tokenizer."""
    if tokenizer:
        return WITH_TOKENIZER, "auto: a tokenizer is configured, so prompts and prices are in the engines' tokens"
    return WITHOUT_TOKENIZER, ("auto: no tokenizer, so prompt lengths are guesses; loadaware compares a match with "
                               "its prompt in one unit")
