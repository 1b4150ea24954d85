"""`approx`: the sidecar's own record of where it sent each prefix (prefix/approx.py), a guess.

Always in `auto`: alone when no exact source is configured, else beside them for the endpoints no complete
source covers. Without a tokenizer it guesses from text units of ~a token each (tokenize/text_units.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from loadaware.prefix.approx import ApproxIndex, ApproxPrefixSource
from loadaware.prefix.spec import BuildContext, Built, SourceSpec, Task

# The approximate index counts blocks of 16 tokens (vLLM's default block), or of 16 text units without a tokenizer.
APPROX_TOKEN_BLOCK = 16


@dataclass(frozen=True)
class ApproxOptions:
    approx_capacity_tokens: int = 100_000
    approx_ttl_s: float = 300.0
    approx_max_blocks: int = 500_000


class ApproxParts(Built):
    def __init__(self, o: ApproxOptions, context: BuildContext) -> None:
        # Tokens, or without a tokenizer text units of ~a token each (tokenize/text_units.py): one block size.
        self.approx = ApproxPrefixSource(
            ApproxIndex(max(1, o.approx_capacity_tokens // APPROX_TOKEN_BLOCK), APPROX_TOKEN_BLOCK, o.approx_ttl_s,
                        o.approx_max_blocks), context.metrics)
        super().__init__(self.approx)
        self.lifecycle_listener = self.approx  # the guess is made of what the sidecar routed

    def tasks(self) -> list[tuple[str, Task]]:
        return [("approx-decay", self.approx.run)]

    def state(self) -> dict[str, object]:
        return self.approx.state()

    def refresh_gauges(self) -> None:
        self.approx.refresh_gauges()

    def endpoint_removed(self, endpoint: str) -> None:
        self.approx.drop(endpoint)


APPROX = SourceSpec("approx", ApproxParts, ApproxOptions, exact=False, complete=False, needs_tokenizer=False,
                    default=lambda o: True, auto_help="approx always", title="the sidecar's record")
