"""Long prompts: past --tokenize-max-chars only the head is tokenized (its ids a prefix of the whole prompt's,
its length estimated), and a tokenizer backlog that would not start an encode within the time box refuses it
at once instead of letting the request wait for the time-out."""

from __future__ import annotations

import random

from loadaware.fleet.registry import EndpointRegistry
from loadaware.lifecycle import RequestLifecycle
from loadaware.load.tracker import LoadTracker
from loadaware.policies import make_policy
from loadaware.routing.builder import build_decider
from loadaware.routing.request import InferenceRequest
from loadaware.tokenize.tokenizer import HEAD_SLACK_TOKENS, AsyncTokenizer, PromptTokenizer, TokenHead, TokenizerBusy

TOKENIZER = "sim/assets/tiny-model"
WORDS = ["context", "retrieval", "document", "passage", "answer", "question", "agent", "tool", "result", "summary"]


def prompt(chars: int, seed: int = 1) -> str:
    rng = random.Random(seed)
    words: list[str] = []
    while sum(len(w) + 1 for w in words) < chars:
        words.append(rng.choice(WORDS))
    return " ".join(words)


async def test_a_long_prompt_is_tokenized_up_to_its_head_whose_ids_begin_the_whole_prompts() -> None:
    tok = PromptTokenizer(TOKENIZER)
    text = prompt(20_000)
    whole = tok.encode_prompt(text)
    head = await AsyncTokenizer(tok, timeout_s=5.0, max_chars=4_000).encode_prompt(text)
    assert isinstance(head, TokenHead)
    assert list(head) == whole[:len(head)]  # the cut's last tokens were dropped: the rest is exact
    assert len(head) >= len(tok.encode_prompt(text[:4_000])) - HEAD_SLACK_TOKENS - 1
    assert abs(head.total - len(whole)) / len(whole) < 0.05  # the whole length, estimated
    short = await AsyncTokenizer(tok, timeout_s=5.0, max_chars=40_000).encode_prompt(text)
    assert not isinstance(short, TokenHead) and list(short) == whole


async def test_a_chat_past_the_bound_is_tokenized_up_to_its_head() -> None:
    tok = PromptTokenizer(TOKENIZER)
    messages = [{"role": "user", "content": prompt(20_000)}]
    whole = await AsyncTokenizer(tok, timeout_s=5.0).encode_chat(messages)
    head = await AsyncTokenizer(tok, timeout_s=5.0, max_chars=4_000).encode_chat(messages)
    assert isinstance(head, TokenHead) and list(head) == whole[:len(head)]
    assert abs(head.total - len(whole)) / len(whole) < 0.05


async def test_a_backlog_that_cannot_start_an_encode_in_time_refuses_it_at_once() -> None:
    tok = AsyncTokenizer(PromptTokenizer(TOKENIZER), timeout_s=0.2, threads=1, inline_chars=0)
    await tok.encode_prompt(prompt(8_000))  # learns the cost of a character
    assert tok._s_per_char > 0
    tok._s_per_char = 1e-3  # as if a character cost 1 ms: 8,000 of them cannot finish in 0.2 s
    submitted: list[object] = []
    submit = tok._pool.submit
    tok._pool.submit = lambda *args, **kwargs: submitted.append(args) or submit(*args, **kwargs)  # type: ignore
    try:
        await tok.encode_prompt(prompt(8_000, seed=2))
        raise AssertionError("expected TokenizerBusy")
    except TokenizerBusy:
        pass
    # Refused at once: nothing was handed to the threads, so nothing waited out the 0.2 s time box (a wall-clock
    # bound here failed beside busy runs of both cores: 59 ms against 0.05 s once, 156 ms against 0.15 s once).
    assert submitted == [] and tok.busy == 1


async def test_the_decision_counts_the_whole_prompt_and_names_a_busy_tokenizer() -> None:
    fleet = ("127.0.0.2:8000", "127.0.0.3:8000")
    tok = AsyncTokenizer(PromptTokenizer(TOKENIZER), timeout_s=5.0, max_chars=4_000)
    decider = build_decider(
        make_policy("loadaware"), EndpointRegistry(fleet), LoadTracker(stale_s=5), RequestLifecycle(),
                      tok)
    text = prompt(20_000)
    whole = len(PromptTokenizer(TOKENIZER).encode_prompt(text))
    decision = await decider.decide(InferenceRequest("completions", prompt=text))
    assert abs(decision.prompt_tokens - whole) / whole < 0.05 and decision.outcome in ("routed", "fallback_load_only")
    assert "tokenizer_busy" not in decision.reasons
    tok._s_per_char = 1.0  # nothing can start in time now
    busy = await decider.decide(InferenceRequest("completions", prompt=prompt(20_000, seed=3)))
    assert "tokenizer_busy" in busy.reasons and busy.endpoint in fleet  # decided on load alone, at once
