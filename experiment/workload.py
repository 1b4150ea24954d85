"""The reference workload (experiment/README.md), deterministic per seed, as token ids and as HTTP bodies.

    128 shared prefixes, Zipf s = 0.9 over them; each prompt = a prefix of 1,544 tokens + a unique suffix
    of 34 tokens (1,578 in all); open-loop arrivals at `rate` (Poisson by default); 500 requests per seed;
    max_tokens 64, ignore_eos, streaming; warm-up = two passes over every prefix, in a seeded order.

Token counts are MEASURED with the project's tokenizer (sim/assets/tiny-model, the one the simulated engines
and the sidecar use), not estimated from characters: the texts are built word by word until the encoded
length is exactly the target.

Why the shared prefix is not aligned to a 256-token boundary by default: the reference states 1,544 shared
+ 34 unique = 1,578 tokens, "~97.8% cacheable" = 1,544 / 1,578. Aligning the prefix to 1,536 tokens would
also give 97.8% (1,536 / 1,570) but would change the stated lengths, and changes nothing that matters: with
a 1,544-token prefix the largest reusable prefix is 1,536 tokens both for vLLM's 16-token blocks (block 96
mixes 8 prefix and 8 suffix tokens) and for LMCache's 256-token chunks (6 full chunks), so the hit-rate
ceiling is 1,536 / 1,578 = 97.3% either way and the reference's 0.912 is measured under that same ceiling.
`align_prefix_to=256` is there for experiments that want the boundary.

What is seeded by what: prefix texts depend only on `corpus_seed` (the same documents in every seed, as in
the reference); the prefix sequence, suffixes, warm-up order and arrival times depend on `seed`. Each of
them uses its own numpy stream, so changing e.g. the arrival process leaves the prefix sequence unchanged
(paired comparisons across arrival processes stay paired).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np

from sim.make_tokenizer import WORDS
from sim.tokenization import SimTokenizer

DEFAULT_TOKENIZER_DIR = Path(__file__).resolve().parents[1] / "sim" / "assets" / "tiny-model"

Api = Literal["completions", "chat"]
Arrival = Literal["poisson", "gamma", "mmpp", "ramp"]

RAMP_FROM, RAMP_TO = 0.5, 1.5  # "ramp" arrivals: the rate's multiples at the first and the last request
# Independent random streams per purpose: np.random.default_rng([seed, STREAM]) (see module docstring).
_STREAM_PREFIX, _STREAM_ARRIVAL, _STREAM_SUFFIX, _STREAM_WARMUP = 1, 2, 3, 4


@dataclass(frozen=True)
class WorkloadSpec:
    n_prefixes: int = 128
    zipf_s: float = 0.9
    prefix_tokens: int = 1544  # tokens every request of a prefix shares (for chat: template head included)
    suffix_tokens: int = 34  # unique tokens per request (for chat: template tail included)
    align_prefix_to: int = 0  # round prefix_tokens down to a multiple of this (0: keep as given)
    rate: float = 16.0  # mean offered requests per second
    n_requests: int = 500
    max_tokens: int = 64
    api: Api = "completions"
    arrival: Arrival = "poisson"
    burst_cv: float = 3.0  # gamma: coefficient of variation of the gaps (1 = Poisson)
    mmpp_high_factor: float = 3.0  # mmpp: rate in the high state, as a multiple of `rate`
    mmpp_high_share: float = 0.2  # mmpp: long-run share of time in the high state
    mmpp_high_mean_s: float = 2.0  # mmpp: mean duration of a high period
    warmup_passes: int = 2
    warmup_rate: float | None = None  # warm-up arrivals (Poisson); None: same as `rate`
    # "drained": each pass starts once the previous one has finished (a prefix's second visit always sees
    # its first visit's cache entry); "continuous": the passes follow each other without a pause, as one
    # open-loop stream (a hot-path race can then leave a prefix on two engines).
    warmup_mode: Literal["drained", "continuous"] = "drained"
    corpus_seed: int = 0
    model: str = "tiny-model"
    # Multi-turn chat (turns > 1; simulator workloads): each conversation opens on a Zipf-drawn shared prefix
    # (its system prompt) and sends `turns` requests, each the whole history so far (prefix, every earlier
    # user message and reply) plus a new `suffix_tokens` user message; conversations start at rate / turns,
    # each next turn `turn_gap_s` + Exp(`think_s`) after the previous one was sent.
    turns: int = 1
    turn_gap_s: float = 6.0
    think_s: float = 4.0

    def __post_init__(self) -> None:
        if self.n_prefixes < 1 or self.n_requests < 0 or self.max_tokens < 1:
            raise ValueError("n_prefixes and max_tokens must be >= 1, n_requests >= 0")
        if self.rate <= 0 or self.zipf_s < 0:
            raise ValueError("rate must be > 0 and zipf_s >= 0")
        if self.prefix_tokens < 1 or self.suffix_tokens < 1:
            raise ValueError("prefix_tokens and suffix_tokens must be >= 1")
        if self.arrival == "mmpp" and self.mmpp_high_factor * self.mmpp_high_share > 1:
            raise ValueError("mmpp: high_factor * high_share must be <= 1 (the low state's rate would be < 0)")

    @property
    def shared_tokens(self) -> int:
        if self.align_prefix_to > 0:
            return max(self.align_prefix_to, self.prefix_tokens // self.align_prefix_to * self.align_prefix_to)
        return self.prefix_tokens


@dataclass(frozen=True, slots=True)
class Request:
    index: int  # position in its phase
    phase: Literal["warmup", "measure"]
    send_at: float  # seconds from the start of its wave
    prefix: int  # 0-based popularity rank (0 = the most popular prefix)
    token_ids: tuple[int, ...]  # exactly what the engine's tokenizer produces for the body below
    prefix_text: str
    suffix_text: str
    max_tokens: int
    api: Api
    model: str
    wave: int = 0  # warm-up wave: a driver sends wave k+1 once wave k has drained; 0 when measured

    @property
    def prompt_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def path(self) -> str:
        return "/v1/chat/completions" if self.api == "chat" else "/v1/completions"

    def body(self) -> dict[str, Any]:
        """The OpenAI-style JSON body: streaming, ignore_eos (vLLM's extension) so every request decodes
        exactly max_tokens, as in the reference."""
        common: dict[str, Any] = {"model": self.model, "max_tokens": self.max_tokens, "stream": True,
                                  "ignore_eos": True, "temperature": 0.0}
        if self.api == "chat":
            return {**common, "messages": [{"role": "system", "content": self.prefix_text},
                                           {"role": "user", "content": self.suffix_text}]}
        return {**common, "prompt": self.prefix_text + self.suffix_text}


@dataclass(frozen=True)
class Workload:
    spec: WorkloadSpec
    seed: int
    warmup: tuple[Request, ...]
    requests: tuple[Request, ...]
    prefix_ids: tuple[tuple[int, ...], ...] = field(repr=False)  # shared token ids of each prefix

    @property
    def duration_s(self) -> float:
        return self.requests[-1].send_at if self.requests else 0.0


def zipf_probabilities(n: int, s: float) -> np.ndarray:
    """P(rank k) = k^-s / H(n, s), k = 1..n."""
    weights = np.arange(1, n + 1, dtype=float) ** -s
    return weights / weights.sum()


# ---- arrivals ------------------------------------------------------------------------------------------
def arrival_times(spec: WorkloadSpec, n: int, rng: np.random.Generator, rate: float | None = None) -> np.ndarray:
    """`n` send times (seconds, first at 0) from the spec's arrival process at mean `rate`."""
    rate = spec.rate if rate is None else rate
    if n == 0:
        return np.zeros(0)
    if spec.arrival == "poisson":
        gaps = rng.exponential(1.0 / rate, n)
    elif spec.arrival == "gamma":
        # Gamma gaps with mean 1/rate and CV burst_cv: shape 1/cv^2 (cv > 1 clusters arrivals in bursts).
        shape = 1.0 / spec.burst_cv**2
        gaps = rng.gamma(shape, 1.0 / (rate * shape), n)
    elif spec.arrival == "mmpp":
        return _mmpp_times(spec, n, rng, rate)
    elif spec.arrival == "ramp":
        # A rising load: the k-th gap at rate x (RAMP_FROM + (RAMP_TO - RAMP_FROM) x k / n), the mean rate's
        # multiples from 0.5 to 1.5 (arrivals speed up across the run, as traffic does into a peak).
        gaps = rng.exponential(1.0, n) / (rate * (RAMP_FROM + (RAMP_TO - RAMP_FROM) * np.arange(n) / max(1, n)))
    else:
        raise ValueError(f"unknown arrival process {spec.arrival!r}")
    times = np.cumsum(gaps)
    return times - times[0]


def _mmpp_times(spec: WorkloadSpec, n: int, rng: np.random.Generator, rate: float) -> np.ndarray:
    """Two-state Markov-modulated Poisson process whose long-run mean rate is `rate`."""
    share, factor = spec.mmpp_high_share, spec.mmpp_high_factor
    high_rate = rate * factor
    low_rate = rate * (1 - share * factor) / (1 - share) if share < 1 else 0.0
    mean_dwell = {True: spec.mmpp_high_mean_s, False: spec.mmpp_high_mean_s * (1 - share) / max(share, 1e-9)}
    out: list[float] = []
    t = 0.0
    high = bool(rng.random() < share)  # start in the stationary distribution
    while len(out) < n:
        end = t + rng.exponential(mean_dwell[high])
        r = high_rate if high else low_rate
        if r > 0:
            s = t + rng.exponential(1.0 / r)
            while s < end and len(out) < n:
                out.append(s)
                s += rng.exponential(1.0 / r)
        t, high = end, not high
    times = np.asarray(out)
    return times - times[0]


# ---- texts measured with the tokenizer -----------------------------------------------------------------
@dataclass(frozen=True)
class _Texts:
    tokenizer: SimTokenizer
    fillers: tuple[str, ...]  # words that encode to exactly one token after a space
    chat_head: int  # template tokens before the system content
    chat_mid: int  # template tokens between the system content and the user content
    chat_tail: int  # template tokens after the user content

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.tokenizer.encode(text, add_special_tokens=True).ids

    def fit(self, head: str, target: int, rng: np.random.Generator, tail: str = "") -> str:
        """`head` + space-separated filler words + `tail`, encoding to exactly `target` tokens (head trimmed
        if head and tail alone are too long). Words after a space are their own pre-tokens, so counts add
        up word by word."""
        while len(self.encode(head + tail)) > target and head:
            head = head[:-1]
        if len(self.encode(head + tail)) > target:
            raise ValueError(f"{tail!r} alone is longer than {target} tokens")
        words = [" " + self.fillers[w] for w in rng.choice(len(self.fillers), target)]
        guess = target - len(self.encode(head + tail))  # exact when every filler word is one token
        if guess >= 0 and len(self.encode(head + "".join(words[:guess]) + tail)) == target:
            return head + "".join(words[:guess]) + tail
        lo, hi = 0, target  # otherwise the word count that hits the target, by bisection on measured lengths
        while lo < hi:
            mid = (lo + hi) // 2
            if len(self.encode(head + "".join(words[:mid]) + tail)) < target:
                lo = mid + 1
            else:
                hi = mid
        text = head + "".join(words[:lo]) + tail
        if len(self.encode(text)) != target:
            raise RuntimeError(f"could not fit a text to {target} tokens")
        return text


@functools.lru_cache(maxsize=4)
def _texts(tokenizer_dir: str) -> _Texts:
    tok = SimTokenizer(tokenizer_dir)
    fillers = tuple(w for w in WORDS if len(tok.tokenizer.encode(" " + w, add_special_tokens=False).ids) == 1)
    a, b = "Alpha", "Bravo"
    rendered = tok.encode_chat([{"role": "system", "content": a}, {"role": "user", "content": b}])
    na, nb = (len(tok.tokenizer.encode(x, add_special_tokens=False).ids) for x in (a, b))
    # Locate the two contents in the rendered ids to count the template's own tokens around them.
    ia = _find(rendered, tok.tokenizer.encode(a, add_special_tokens=False).ids)
    ib = _find(rendered, tok.tokenizer.encode(b, add_special_tokens=False).ids)
    return _Texts(tok, fillers, chat_head=ia, chat_mid=ib - ia - na, chat_tail=len(rendered) - ib - nb)


def _find(haystack: Sequence[int], needle: Sequence[int]) -> int:
    for i in range(len(haystack) - len(needle) + 1):
        if list(haystack[i : i + len(needle)]) == list(needle):
            return i
    raise RuntimeError("template probe not found in the rendered chat prompt")


@functools.lru_cache(maxsize=8)
def _prefix_texts(tokenizer_dir: str, corpus_seed: int, n: int, text_tokens: int) -> tuple[str, ...]:
    texts = _texts(tokenizer_dir)
    out = []
    for k in range(n):
        rng = np.random.default_rng([corpus_seed, 1000 + k])
        # A distinct opening per prefix makes the very first 16-token block differ between prefixes.
        out.append(texts.fit(f"Document {k:04d} of corpus {corpus_seed}:", text_tokens, rng))
    return tuple(out)


def prefix_sequence(spec: WorkloadSpec, seed: int, n: int | None = None) -> np.ndarray:
    """The measured requests' prefix ranks (0-based), i.i.d. Zipf(s) over `n_prefixes`."""
    probs = zipf_probabilities(spec.n_prefixes, spec.zipf_s)
    rng = np.random.default_rng([seed, _STREAM_PREFIX])
    return rng.choice(spec.n_prefixes, spec.n_requests if n is None else n, p=probs)


def measured_arrivals(spec: WorkloadSpec, seed: int, n: int | None = None) -> np.ndarray:
    """The measured requests' send times (seconds from the first), from the spec's arrival process."""
    rng = np.random.default_rng([seed, _STREAM_ARRIVAL])
    return arrival_times(spec, spec.n_requests if n is None else n, rng)


def build(spec: WorkloadSpec, seed: int, tokenizer_dir: str | Path = DEFAULT_TOKENIZER_DIR) -> Workload:
    """The workload of one seed. Deterministic: the same (spec, seed) always gives the same requests."""
    tdir = str(tokenizer_dir)
    texts = _texts(tdir)
    chat = spec.api == "chat"
    prefix_text_tokens = spec.shared_tokens - (texts.chat_head + texts.chat_mid if chat else 0)
    suffix_text_tokens = spec.suffix_tokens - (texts.chat_tail if chat else 0)
    if prefix_text_tokens < 8 or suffix_text_tokens < 1:
        raise ValueError("prefix/suffix too short for the chat template")
    prefixes = _prefix_texts(tdir, spec.corpus_seed, spec.n_prefixes, prefix_text_tokens)
    prefix_ids = _prefix_ids(tdir, spec.corpus_seed, spec.n_prefixes, prefix_text_tokens, chat)

    ranks = prefix_sequence(spec, seed)
    times = measured_arrivals(spec, seed)
    # Warm-up: each pass visits every prefix once in its own shuffled order, Poisson-paced. A pass starts
    # only once the previous one has drained, so a prefix's second visit always sees its first visit's
    # cache entry (a cache-aware router then keeps each prefix on one engine, as in the reference).
    wrng = np.random.default_rng([seed, _STREAM_WARMUP])
    warm: list[tuple[int, int, float]] = []
    offset = 0.0
    for k in range(spec.warmup_passes):
        order = wrng.permutation(spec.n_prefixes)
        at = arrival_times(replace(spec, arrival="poisson"), len(order), wrng, rate=spec.warmup_rate or spec.rate)
        wave = k if spec.warmup_mode == "drained" else 0
        if spec.warmup_mode == "continuous" and k > 0:
            at = at + offset + wrng.exponential(1.0 / (spec.warmup_rate or spec.rate))
        offset = float(at[-1]) if len(at) else offset
        warm += [(wave, int(p), float(t)) for p, t in zip(order, at)]
    srng = np.random.default_rng([seed, _STREAM_SUFFIX])

    def make(phase: Literal["warmup", "measure"], i: int, prefix: int, at: float, wave: int = 0) -> Request:
        # Random words first: the suffix's first tokens share a 16-token block with the prefix's last 8,
        # so they must differ between requests or that block would count as a (spurious) cache hit. The
        # phase, seed and index at the end make every suffix unique for certain, across seeds too.
        suffix = texts.fit("", suffix_text_tokens, srng, tail=f" (q {phase[0]}{seed}.{i})")
        ids = prefix_ids[prefix] + tuple(_encode_unique(texts, suffix, chat))
        return Request(i, phase, float(at), int(prefix), ids, prefixes[prefix], suffix, spec.max_tokens,
                       spec.api, spec.model, wave)

    warmup = tuple(make("warmup", i, p, t, wave) for i, (wave, p, t) in enumerate(warm))
    if spec.turns > 1:
        pre, requests = _conversations(spec, seed, texts, prefixes, prefix_ids, suffix_text_tokens, chat)
        warmup += tuple(replace(r, index=len(warmup) + r.index) for r in pre)
    else:
        requests = tuple(make("measure", i, int(p), t) for i, (p, t) in enumerate(zip(ranks, times)))
    return Workload(spec, seed, warmup, requests, prefix_ids)


def _conversations(spec: WorkloadSpec, seed: int, texts: _Texts, prefixes: tuple[str, ...],
                   prefix_ids: tuple[tuple[int, ...], ...], user_tokens: int,
                   chat: bool) -> tuple[tuple[Request, ...], tuple[Request, ...]]:
    """(earlier turns, measured requests) of a multi-turn workload (see WorkloadSpec.turns).

    Conversations start at rate / turns, so in steady state requests arrive at `rate`. The measured window
    starts once that steady state is reached (the span of a whole conversation); the earlier turns of the
    conversations it sees are sent as one more drained warm-up wave, so a conversation in progress finds its
    history where the router put it. A body is one completions prompt holding the whole conversation (its
    token ids are the pieces' ids joined)."""
    ramp = (spec.turns - 1) * (spec.turn_gap_s + spec.think_s)
    n_conv = math.ceil((ramp + spec.n_requests / spec.rate) * spec.rate / spec.turns * 1.2) + spec.turns
    ranks = prefix_sequence(spec, seed, n_conv)
    starts = arrival_times(spec, n_conv, np.random.default_rng([seed, _STREAM_ARRIVAL]), rate=spec.rate / spec.turns)
    grng = np.random.default_rng([seed, _STREAM_ARRIVAL, 1])
    srng = np.random.default_rng([seed, _STREAM_SUFFIX])
    plan: list[tuple[float, int, int]] = []  # (send time, conversation, turn)
    for c, start in enumerate(starts):
        at = float(start)
        for k in range(spec.turns):
            plan.append((at, c, k))
            at += spec.turn_gap_s + float(grng.exponential(spec.think_s))
    plan.sort()
    window = [x for x in plan if x[0] >= ramp][: spec.n_requests]
    last_turn: dict[int, int] = {}
    for _, c, k in window:
        last_turn[c] = max(k, last_turn.get(c, -1))
    built: dict[tuple[int, int], tuple[str, tuple[int, ...]]] = {}
    for c in sorted(last_turn):
        rank = int(ranks[c])
        history, ids = "", prefix_ids[rank]
        for k in range(last_turn[c] + 1):
            user = texts.fit("", user_tokens, srng, tail=f" (q c{seed}.{c}.{k})")
            history += user
            ids = ids + tuple(_encode_unique(texts, user, chat))
            built[(c, k)] = (history, ids)
            reply = texts.fit("", spec.max_tokens, srng)  # the assistant's answer, as the next turn resends it
            history += reply
            ids = ids + tuple(_encode_unique(texts, reply, False))
    in_window = {(c, k) for _, c, k in window}
    earlier = sorted((at, c, k) for at, c, k in plan if c in last_turn and k < last_turn[c] and (c, k) not in in_window)
    wrng = np.random.default_rng([seed, _STREAM_WARMUP, 1])
    pace = arrival_times(replace(spec, arrival="poisson"), len(earlier), wrng, rate=spec.warmup_rate or spec.rate)

    def req(phase: Literal["warmup", "measure"], i: int, at: float, c: int, k: int, wave: int) -> Request:
        history, ids = built[(c, k)]
        rank = int(ranks[c])
        return Request(i, phase, at, rank, ids, prefixes[rank], history, spec.max_tokens, spec.api, spec.model, wave)

    t0 = window[0][0] if window else 0.0
    pre = tuple(req("warmup", i, float(t), c, k, spec.warmup_passes)
                for i, (t, (_, c, k)) in enumerate(zip(pace, earlier)))
    measured = tuple(req("measure", i, at - t0, c, k, 0) for i, (at, c, k) in enumerate(window))
    return pre, measured


@functools.lru_cache(maxsize=8)
def _prefix_ids(tokenizer_dir: str, corpus_seed: int, n: int, text_tokens: int,
                chat: bool) -> tuple[tuple[int, ...], ...]:
    texts = _texts(tokenizer_dir)
    prefixes = _prefix_texts(tokenizer_dir, corpus_seed, n, text_tokens)
    return tuple(tuple(_encode_shared(texts, p, chat)) for p in prefixes)


def _encode_shared(texts: _Texts, prefix_text: str, chat: bool) -> list[int]:
    """Token ids every request of this prefix starts with (for chat: up to the user's content)."""
    if not chat:
        return texts.encode(prefix_text)
    full = texts.tokenizer.encode_chat([{"role": "system", "content": prefix_text},
                                        {"role": "user", "content": "x"}])
    return full[: len(full) - texts.chat_tail - 1]  # "x" is one token


def _encode_unique(texts: _Texts, suffix_text: str, chat: bool) -> list[int]:
    ids = texts.tokenizer.tokenizer.encode(suffix_text, add_special_tokens=False).ids
    if not chat:
        return ids
    tail = texts.tokenizer.encode_chat([{"role": "user", "content": "x"}])[-texts.chat_tail:]
    return ids + tail


def encode_request(request: Request, tokenizer_dir: str | Path = DEFAULT_TOKENIZER_DIR) -> list[int]:
    """Encode a request's body the way the engine does (slow path; tests check it equals `token_ids`)."""
    tok = _texts(str(tokenizer_dir)).tokenizer
    return tok.encode_request(request.body(), chat=request.api == "chat")


def describe(workload: Workload) -> dict[str, float]:
    """Measured shape of a workload: token counts, cacheable share, rank-1 share, offered rate."""
    reqs = workload.requests
    if not reqs:
        return {}
    prompt = np.array([r.prompt_tokens for r in reqs])
    shared = np.array([len(workload.prefix_ids[r.prefix]) for r in reqs])
    span = reqs[-1].send_at
    return {
        "requests": float(len(reqs)),
        "prompt_tokens_mean": float(prompt.mean()),
        "shared_tokens_mean": float(shared.mean()),
        "unique_tokens_mean": float((prompt - shared).mean()),
        "shared_fraction": float(shared.sum() / prompt.sum()),
        "block16_ceiling": float((shared // 16 * 16).sum() / prompt.sum()),
        "rank1_share": float(np.mean([r.prefix == 0 for r in reqs])),
        "rank1_probability": float(zipf_probabilities(workload.spec.n_prefixes, workload.spec.zipf_s)[0]),
        "offered_rate": float((len(reqs) - 1) / span) if span > 0 else math.inf,
    }
