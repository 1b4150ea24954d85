"""The seam every prefix source implements: "how many of this prompt's tokens does each endpoint hold?"

Sources: the LMCache controller (lmcache/source.py), and any later index (KV events, approximate). The decision
pipeline only knows this interface.

Tenant isolation (vLLM's `cache_salt`): vLLM adds a request's salt to the extra keys of the hash of the
block that starts at token 0 (`generate_block_hash_extra_keys` in vllm/v1/core/kv_cache_utils.py), and every
later block chains on that hash, so a salted prompt only hits blocks cached under the same salt and salted
blocks never serve an unsalted prompt. A source is asked with the request's salt and must credit only what
a request with that salt would really hit; a source that cannot tell salts apart credits a salted request
nothing (prefix credit may under-credit, never over-credit).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol


class PrefixUnavailable(Exception):
    """The source could not answer in time; the decision falls back to load only."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason  # a short metric label, e.g. lmcache_timeout


class PartlyUnavailable(PrefixUnavailable):
    """One of several combined sources could not answer; the others did (`answer`). The decision uses their
    answer and still names the lost source's reason (prefix/combined.py)."""

    def __init__(self, reason: str, answer: dict[str, int]) -> None:
        super().__init__(reason, "the other prefix sources answered")
        self.answer = answer


class PromptTokens(list[int]):
    """A decision's prompt token ids with what travels with them: the request's cache salt (what the engine's
    prefix cache really keys on besides the tokens) and the block-key chains computed from them, one per
    block size (blocks.chain_keys: one decision walks the same chain in more than one index, and a chain costs
    ~27 ns a token). The decision keeps them until it is announced (its listeners read them), so no prompt
    outlives its decision; the approximate index keeps the chain it recorded, as the decision's receipt, for
    the request's life (a retry served elsewhere is recorded there too)."""

    __slots__ = ("chains", "salt")

    def __init__(self, tokens: Iterable[int], salt: str | None = None) -> None:
        super().__init__(tokens)
        self.salt = salt
        self.chains: dict[tuple[int, str | None], list[int]] = {}


def salt_of(tokens: Sequence[int], salt: str | None = None) -> str | None:
    """The salt a lookup must honour: the one given, else the one the token list carries. vLLM ignores an
    empty salt (and its API rejects one), so "" means no salt."""
    if salt is None and isinstance(tokens, PromptTokens):
        salt = tokens.salt
    return salt or None


class PrefixSource(Protocol):
    name: str

    async def matches(self, tokens: Sequence[int], endpoints: tuple[str, ...],
                      salt: str | None = None) -> dict[str, int]:
        """Matched prefix tokens per endpoint (absent = 0) for a request with cache salt `salt` (None: an
        unsalted request). Raises PrefixUnavailable."""
        ...
