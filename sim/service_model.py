"""Service-time model of one engine. Pure arithmetic, no clocks, so a discrete-event experiment can reuse it.

Defaults are deliberately fast so tests run in milliseconds: a 1,600-token cold prefill costs
4 ms + 1600 / 100k tok/s = 20 ms, one decode step 4 ms + 0.25 ms per running sequence (~5 ms at 4).
A later issue calibrates these numbers to an A10 running Qwen2.5-3B.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, fields, replace


@dataclass(frozen=True, slots=True)
class ServiceModel:
    prefill_tokens_per_s: float = 100_000.0  # applied to tokens neither GPU- nor LMCache-cached
    prefill_overhead_ms: float = 4.0  # fixed cost of every prefill (scheduling, the last-token forward)
    lmcache_load_tokens_per_s: float = 1_000_000.0  # tokens fetched from the LMCache CPU store
    decode_base_ms: float = 4.0
    decode_per_seq_ms: float = 0.25  # each extra running sequence slows every step
    max_num_seqs: int = 64  # beyond it requests wait (vllm:num_requests_waiting)
    kv_capacity_tokens: int = 262_144  # GPU KV cache; prefix-cache capacity = this / block_size
    block_size: int = 16
    lmcache_capacity_chunks: int = 4096  # LMCache CPU store, in 256-token chunks (1 Mi tokens)
    # Prefill throughput is one shared resource per engine (the GPU), so concurrent prefills queue behind
    # each other; without this a burst of cache misses would cost no more than one, and cache locality
    # would not matter for throughput. 0 lets prefills overlap freely.
    serialize_prefill: int = 1
    # vLLM runs a prefill inside an engine step together with every running decode, so a prompt's first
    # token comes out only at the end of such a step: TTFT grows with the batch even on a full cache hit.
    # This adds that many decode-step times (at the batch of the moment) after the prefill compute; 0 = off.
    ttft_decode_steps: float = 0.0
    # ...and decodes share the GPU with prefills (chunked prefill): a decode step that starts while prefill
    # work is queued on the engine's lane also carries up to this many tokens of it (vLLM's token budget
    # per step), so a burst of cache misses slows every running stream. 0 = off (decodes never wait).
    prefill_chunk_tokens: int = 0

    def __post_init__(self) -> None:
        if self.prefill_tokens_per_s <= 0 or self.lmcache_load_tokens_per_s <= 0:
            raise ValueError("throughputs must be positive")
        if self.max_num_seqs < 1 or self.block_size < 1 or self.kv_capacity_tokens < self.block_size:
            raise ValueError("max_num_seqs, block_size and kv_capacity_tokens must be positive")
        if min(self.prefill_overhead_ms, self.decode_base_ms, self.decode_per_seq_ms, self.ttft_decode_steps,
               self.prefill_chunk_tokens) < 0:
            raise ValueError("times must be >= 0")

    @property
    def kv_capacity_blocks(self) -> int:
        return self.kv_capacity_tokens // self.block_size

    def prefill_seconds(self, computed_tokens: int, loaded_tokens: int = 0) -> float:
        """Time to prefill `computed_tokens` from scratch and load `loaded_tokens` from LMCache."""
        return (
            self.prefill_overhead_ms / 1000.0
            + max(0, computed_tokens) / self.prefill_tokens_per_s
            + max(0, loaded_tokens) / self.lmcache_load_tokens_per_s
        )

    def decode_step_seconds(self, running: int, pending_prefill_s: float = 0.0) -> float:
        """One decode step when `running` sequences share the batch and `pending_prefill_s` seconds of
        prefill work wait on the lane (the step carries up to one chunk of it, see prefill_chunk_tokens)."""
        step = (self.decode_base_ms + self.decode_per_seq_ms * max(1, running)) / 1000.0
        if self.prefill_chunk_tokens and pending_prefill_s > 0:
            step += min(pending_prefill_s, self.prefill_chunk_tokens / self.prefill_tokens_per_s)
        return step

    def first_token_seconds(self, running: int) -> float:
        """Latency between the end of a prefill's compute and its first token (see ttft_decode_steps)."""
        return self.ttft_decode_steps * self.decode_step_seconds(running) if self.ttft_decode_steps else 0.0


class PrefillLane:
    """The engine's prefill compute as a FIFO lane: each prefill starts when the previous one ends."""

    def __init__(self) -> None:
        self.free_at = 0.0

    def reserve(self, now: float, duration: float) -> float:
        """Book `duration` seconds of prefill; returns when it finishes."""
        start = max(now, self.free_at)
        self.free_at = start + duration
        return self.free_at


def split_prompt(prompt_tokens: int, gpu_hit: int, lmcache_hit: int) -> tuple[int, int]:
    """(tokens to compute, tokens to load from LMCache) for a prompt with the given cached prefixes.

    vLLM always recomputes at least the last prompt token (it needs its logits), so a full hit still
    computes one token.
    """
    reused = min(max(gpu_hit, lmcache_hit), max(0, prompt_tokens - 1))
    loaded = max(0, min(lmcache_hit, reused) - gpu_hit)
    return prompt_tokens - reused, loaded


def add_cli_flags(parser: argparse.ArgumentParser) -> None:
    """One `--sm-<field>` flag per parameter (dashes for underscores); unset flags keep the defaults."""
    group = parser.add_argument_group("service model")
    for f in fields(ServiceModel):
        flag = "--" + f.name.replace("_", "-")
        group.add_argument(flag, dest=f"sm_{f.name}", type=int if f.type == "int" else float, default=None)


def from_cli_args(args: argparse.Namespace, base: ServiceModel | None = None) -> ServiceModel:
    overrides = {
        f.name: getattr(args, f"sm_{f.name}")
        for f in fields(ServiceModel)
        if getattr(args, f"sm_{f.name}", None) is not None
    }
    return replace(base or ServiceModel(), **overrides)
