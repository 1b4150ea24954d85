"""Case `conversation_tokens`: the time to tokenize each turn of an agent session, with the conversation cache
(loadaware/tokenize/conversation.py) and without it.

A session of `--turns` turns grows to about `--final-kb` KB of messages: a system prompt, then per turn a user
message (a tool's output, mostly) and the assistant's answer. `--sessions` sessions of the same shape and different
text run side by side, turn by turn, each through the same tokenizer (the repository's tiny tokenizer): per turn the
median over the sessions of

    on      ConversationTokens: render, look up the earlier turns (prepare), encode the rest and keep this turn
            (finish); `finish` is the tokenization proper, `prepare` what grows with the conversation (the
            rendering, the keys, the cached ids copied into the request's list)
    off     PromptTokenizer.encode_chat: render, encode the whole text (the piece cache on, as shipped)
    whole   the rendered text encoded whole with no cache at all (what a turn costs from the first character)
    render  the rendering alone (both include it once; `on` renders a second time, closed, to keep the turn)

then the ratio of the last 10 turns' median to turns 2-5's, for `on` and `off` (flat is 1). Every turn's ids are
checked equal between the two.

    python -m bench.conversation_tokens [--turns 40] [--final-kb 220] [--sessions 5]
    python -m bench.run --cases conversation_tokens      (make bench BENCH_ARGS="--cases conversation_tokens")
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Sequence
from typing import Any

from loadaware.tokenize.conversation import ConversationTokens
from loadaware.tokenize.tokenizer import PromptTokenizer
from testkit.paths import TINY_TOKENIZER

WORDS = ("context retrieval document passage answer question agent tool result summary table figure section "  # noqa: SIM905
         "paragraph citation source evidence claim model prompt token cache prefix engine naïve 42 {}: -> ;").split()


def _text(rng: random.Random, chars: int) -> str:
    out: list[str] = []
    n = 0
    while n < chars:
        word = rng.choice(WORDS)
        out.append(word)
        n += len(word) + 1
        if rng.random() < 0.05:
            out.append("\n")
    return " ".join(out)


def session(seed: int, turns: int, final_kb: int) -> list[list[dict[str, Any]]]:
    """Each turn's messages: the system prompt, then per turn a user message and (after the first) the answer."""
    rng = random.Random(seed)
    per_turn = final_kb * 1000 // turns
    messages: list[dict[str, Any]] = [{"role": "system", "content": _text(rng, 4000)}]
    out = []
    for t in range(turns):
        if t:
            messages = [*messages, {"role": "assistant", "content": _text(rng, per_turn // 4)}]
        messages = [*messages, {"role": "user", "content": _text(rng, per_turn - per_turn // 4)}]
        out.append(messages)
    return out


def _timed(fn: Any, *args: Any) -> tuple[float, Any]:
    started = time.perf_counter()
    out = fn(*args)
    return time.perf_counter() - started, out


def run(turns: int = 40, final_kb: int = 220, sessions: int = 5) -> dict[str, list[float]]:
    tok_on = PromptTokenizer(str(TINY_TOKENIZER))
    conv = ConversationTokens(tok_on, max_bytes=64 << 20)
    tok_off = PromptTokenizer(str(TINY_TOKENIZER))
    chats = [session(seed, turns, final_kb) for seed in range(sessions)]
    figures: dict[str, list[float]] = {"on": [], "prepare": [], "finish": [], "off": [], "whole": [], "render": [],
                                   "kb": []}
    for t in range(turns):
        on, off, render, prepare, finish, whole = [], [], [], [], [], []
        for chat in chats:
            messages = chat[t]
            s_prepare, prep = _timed(conv.prepare, messages, None)
            s_finish, ids_on = _timed(conv.finish, prep)
            s_on = s_prepare + s_finish
            s_off, ids_off = _timed(tok_off.encode_chat, messages)
            s_render, text = _timed(tok_off.render_chat, messages)
            s_whole, _ = _timed(tok_off.encode_exact, text)
            whole.append(s_whole)
            if ids_on != ids_off:
                raise AssertionError(f"turn {t + 1}: the cache's ids differ from the whole text's")
            on.append(s_on)
            prepare.append(s_prepare)
            finish.append(s_finish)
            off.append(s_off)
            render.append(s_render)
        figures["on"].append(statistics.median(on))
        figures["off"].append(statistics.median(off))
        figures["render"].append(statistics.median(render))
        figures["prepare"].append(statistics.median(prepare))
        figures["finish"].append(statistics.median(finish))
        figures["whole"].append(statistics.median(whole))
        figures["kb"].append(len(text.encode()) / 1000)
    figures["hits"] = [float(conv.cache.hits)]
    return figures


def report(f: dict[str, list[float]]) -> str:
    lines = ["turn   KB   on ms  (prepare  finish)   off ms  whole ms  render ms"]
    for t, kb in enumerate(f["kb"]):
        ms = {k: f[k][t] * 1e3 for k in ("on", "prepare", "finish", "off", "whole", "render")}
        lines.append(f"{t + 1:4d} {kb:5.0f} {ms['on']:7.2f}  ({ms['prepare']:7.2f} {ms['finish']:7.2f}) "
                     f"{ms['off']:8.2f} {ms['whole']:9.2f} {ms['render']:9.2f}")
    early = slice(1, 5)
    for name in ("on", "prepare", "finish", "off", "whole", "render"):
        ratio = statistics.median(f[name][-10:]) / statistics.median(f[name][early])
        lines.append(f"{name}: last 10 turns / turns 2-5 = {ratio:.2f}")
    lines.append(f"cache hits: {int(f['hits'][0])}")
    return "\n".join(lines)


def table(f: dict[str, list[float]]) -> str:
    return f"### Conversation cache: tokenization per turn of a growing session\n\n```\n{report(f)}\n```\n"


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.conversation_tokens", description=__doc__.splitlines()[0])
    p.add_argument("--turns", type=int, default=40)
    p.add_argument("--final-kb", type=int, default=220)
    p.add_argument("--sessions", type=int, default=5)
    args = p.parse_args(argv)
    print(report(run(args.turns, args.final_kb, args.sessions)))


if __name__ == "__main__":
    main()
