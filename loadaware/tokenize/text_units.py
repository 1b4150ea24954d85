"""Text bytes as tokens, for the approximate prefix source when no tokenizer is configured.

Never used for an exact source: LMCache and KV events key blocks by the engine's real token ids.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any


class TextUnits:
    """A stand-in tokenizer for the approximate source alone (never for an exact one): a prompt's units are
    its UTF-8 bytes; a chat's are those of its messages in a canonical JSON form, so conversations that share
    their first messages share a prefix."""

    async def encode_prompt(self, prompt: str | Sequence[int]) -> list[int]:
        if not isinstance(prompt, str):
            return list(prompt)
        return list(prompt.encode("utf-8"))

    async def encode_chat(self, messages: Sequence[dict[str, Any]], options: Any = None) -> list[int]:
        if options and options.get("tools"):  # tools render before the first message in most templates
            messages = [{"tools": options["tools"]}, *messages]
        text = json.dumps(list(messages), ensure_ascii=False, sort_keys=True, separators=(",", ":"))
        return list(text[:-1].encode("utf-8"))  # without the closing "]": a longer chat extends the prefix

    def close(self) -> None:
        pass
