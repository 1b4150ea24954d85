"""Request bodies: a tiny prompt for the transport path, and 1,578-token prompts over shared prefixes for
the full decision (the reference workload's shape: ~1,544-token prefix + a unique ~34-token suffix)."""

from __future__ import annotations

import json
import random
from pathlib import Path

from tokenizers import Tokenizer

REPO = Path(__file__).resolve().parents[1]
TOKENIZER_JSON = REPO / "sim" / "assets" / "tiny-model" / "tokenizer.json"
MODEL = "tiny-model"

PROMPT_TOKENS = 1578
PREFIX_TOKENS = 1544

_WORDS = (  # noqa: SIM905 - a word list reads best as running text
    "the of and to in is was for on that with as by at from this be are or an it not have which but all "
    "were they their one been has more when will would there who can time about if so out up into some "
    "other could than then its only first new two these may any after most also made over such where "
    "many before must through back years much your way well down should because each just those people "
    "how too little state good very make world still own see men work long get here between both life "
    "being under never day same another know while last might us great old year off come since against "
    "go came right used take three cache engine router prefix token request latency load score decode "
    "prefill batch queue worker chunk lookup memory model server gateway stream header body policy"
).split()


def _body(prompt: str, max_tokens: int, stream: bool) -> str:
    """A /v1/completions body; `stream` asks for SSE and every one of the max_tokens (`ignore_eos`)."""
    body: dict[str, object] = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens}
    if stream:
        body.update(stream=True, ignore_eos=True)
    return json.dumps(body)


def tiny_body(max_tokens: int = 1, stream: bool = False) -> str:
    return _body("Hi there", max_tokens, stream)


class PromptBuilder:
    """Pseudo-text with exact token counts under the tiny tokenizer (ByteLevel BPE: " word" pieces
    tokenize independently, so counts add up and a prefix's tokens do not change when text follows it)."""

    def __init__(self, tokenizer_json: Path = TOKENIZER_JSON) -> None:
        self.tok = Tokenizer.from_file(str(tokenizer_json))
        self._cost = {w: len(self.tok.encode(" " + w, add_special_tokens=False).ids) for w in _WORDS}
        self._one = [w for w in _WORDS if self._cost[w] == 1]
        if not self._one:
            raise RuntimeError("tokenizer has no single-token words in the word list")

    def count(self, text: str) -> int:
        return len(self.tok.encode(text, add_special_tokens=True).ids)

    def text(self, rng: random.Random, tokens: int, lead: str = "") -> str:
        """About `tokens` tokens of " word" pieces (exact when every piece costs what it costs alone)."""
        parts = [lead] if lead else []
        used = self.count(lead) if lead else 0
        while used < tokens:
            room = tokens - used
            w = rng.choice(_WORDS)
            if self._cost[w] > room:
                w = rng.choice(self._one)
            parts.append(" " + w)
            used += self._cost[w]
        return "".join(parts)

    def prompt(self, prefix: str, rng: random.Random, total: int = PROMPT_TOKENS) -> str:
        """prefix + a random suffix, trimmed/padded with single-token words to exactly `total` tokens."""
        base = self.count(prefix)
        text = prefix + self.text(rng, max(1, total - base))
        n = self.count(text)
        while n < total:
            text += " " + rng.choice(self._one)
            n = self.count(text)
        while n > total:
            text = text[: text.rindex(" ")]
            n = self.count(text)
        if n != total or not text.startswith(prefix):
            raise RuntimeError(f"could not build a {total}-token prompt (got {n})")
        return text


def decision_bodies(prefixes: int = 64, per_prefix: int = 8, seed: int = 7, max_tokens: int = 1,
                    builder: PromptBuilder | None = None, stream: bool = False) -> tuple[list[str], list[str]]:
    """(warm-up bodies: one per prefix, measured bodies: prefixes x per_prefix interleaved so consecutive
    requests use different prefixes). Every prompt is exactly PROMPT_TOKENS tokens. `stream` applies to the
    measured bodies (the warm-up ones only fill the caches: max_tokens 1, not streamed)."""
    b = builder or PromptBuilder()
    rng = random.Random(seed)
    heads = [b.text(rng, PREFIX_TOKENS, lead=f"Document {k} about") for k in range(prefixes)]

    warm = [_body(b.prompt(h, rng), 1, False) for h in heads]
    measured = [_body(b.prompt(heads[k], rng), max_tokens, stream) for _ in range(per_prefix) for k in range(prefixes)]
    return warm, measured
