"""Text as tokens, for the approximate prefix source when no tokenizer is configured.

A unit is 4 UTF-8 bytes of the text (the last may be shorter): about one token of English text for the BPE
tokenizers of current models (OpenAI's rule of thumb: a token is ~4 characters). So a prompt's unit count is
in the same unit as the engines' KV capacities and the policies' per-token prices (tokens), within the
tokenizer's own ratio, and the approximate index counts blocks of 16 units as it counts blocks of 16 tokens.

Never used for an exact source: LMCache and KV events key blocks by the engine's real token ids.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

BYTES_PER_UNIT = 4


def units_of(data: bytes) -> list[int]:
    """`data` as units: each 4-byte group read as one number (a shorter last group is padded apart: its length
    is part of the unit, so "ab" and "ab\\0\\0" differ)."""
    n = len(data)
    full = n - n % BYTES_PER_UNIT
    out = [int.from_bytes(data[i:i + BYTES_PER_UNIT], "little") for i in range(0, full, BYTES_PER_UNIT)]
    if full < n:
        out.append(int.from_bytes(data[full:], "little") | ((n - full) << 32))
    return out


class TextUnits:
    """A stand-in tokenizer for the approximate source alone (never for an exact one): a prompt's units are
    its UTF-8 bytes in groups of 4; a chat's are those of its messages in a canonical JSON form, so
    conversations that share their first messages share a prefix."""

    async def encode_prompt(self, prompt: str | Sequence[int]) -> list[int]:
        if not isinstance(prompt, str):
            return list(prompt)
        return units_of(prompt.encode("utf-8"))

    async def encode_chat(self, messages: Sequence[dict[str, Any]], options: Any = None) -> list[int]:
        if options and options.get("tools"):  # tools render before the first message in most templates
            messages = [{"tools": options["tools"]}, *messages]
        text = json.dumps(list(messages), ensure_ascii=False, sort_keys=True, separators=(",", ":"))
        return units_of(text[:-1].encode("utf-8"))  # without the closing "]": a longer chat extends the prefix

    def close(self) -> None:
        pass
