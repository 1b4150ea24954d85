"""The sidecar's memory, bound by bound: what each unit of bounded state costs, and the worst case of a
configuration (every bound full at once, on top of the process itself and its traffic).

The per-unit costs were measured on CPython 3.11, x86-64, by filling each structure for real; docs/memory.md
gives the figures and how they were taken, and tests/unit/test_memory_costs.py checks that a fill still
costs no more than the constant says. tests/k8s/test_memory_budget.py checks that the worst case of the
defaults, with each shipped manifest's environment, fits that manifest's memory limit with a margin.
Pure arithmetic: no I/O, nothing imported from the rest of the sidecar.
"""

from __future__ import annotations

from dataclasses import dataclass

from loadaware.fleet.state_holders import DEFAULT_MAX_ENTRIES as DEFAULT_STATE_ENTRIES
from loadaware.prefix.queued import BYTES_PER_QUEUED_BLOCK
from loadaware.prefix.queued import DEFAULT_MAX_BLOCKS as QUEUED_MAX_BLOCKS
from loadaware.prefix.working_set import MAX_ENTRIES as WORKING_SET_MAX_ENTRIES
from loadaware.routing.affinity import DEFAULT_MAX_ENTRIES as DEFAULT_SESSION_ENTRIES
from loadaware.telemetry.decisions import RING_CANDIDATES
from loadaware.tokenize.conversation import DEFAULT_MB as CONVERSATION_CACHE_DEFAULT_MB

MiB = 1 << 20

# ---- measured per-unit costs (bytes of resident memory) ----
# KV-events index (prefix/blocks.py BlockIndex): one block of one engine whose key no other engine holds
# (the worst case: every chain distinct), 32-byte engine hashes as newer vLLM sends them; the most measured
# over fills of 0.7-2.5M blocks (283-368 B: where the dicts' last resize falls).
KV_INDEX_BYTES_PER_BLOCK = 370
# Approximate index (prefix/approx.py ApproxIndex): one guessed block (measured 167-186 B).
APPROX_BYTES_PER_BLOCK = 190
# Tokenizer piece cache (tokenize/pieces.py): one cached token id (an 8 B reference in the piece's list to the
# vocabulary's shared int, tokenize/shared_ids.py) plus its share of the piece's text and entry, at ~5 characters
# a token (measured 16.4 B RSS, 15.9 B tracemalloc).
PIECE_CACHE_BYTES_PER_TOKEN = 17
# Conversation cache (tokenize/conversation.py): its bound is in bytes it counts itself (4 B a token id in an
# array('i'), 256 B an entry); the arrays' growth slack (~1/16 when appended to) makes the resident cost at most
# ~1.1 times the count (tests/unit/test_conversation_tokens.py measures it with tracemalloc).
CONVERSATION_CACHE_RESIDENT_PER_COUNTED = 1.1
# Recent-decisions ring (telemetry/decisions.py): one decision, plus one of the ranked head's candidates (at most
# RING_CANDIDATES; a Candidate with its optional token-signal and working-set fields), measured 721 B and 285 B
# with tracemalloc.
RECENT_DECISION_BYTES = 760
RECENT_CANDIDATE_BYTES = 300
# The prefix working set (prefix/working_set.py): one sampled key or prompt head in its LRU (a 62-bit int key and
# an OrderedDict slot), measured 177 B; it holds at most 2 x MAX_ENTRIES of them whatever the fleet's size.
WORKING_SET_BYTES_PER_ENTRY = 190
# Token signals (load/signals.py): one endpoint's entry (its counts, learned TTFT model, histogram counters and
# prefill clock), measured with tracemalloc over 10,000 endpoints: 1,029 B scraped only, 2,709 B once both
# TTFT models (the endpoint's and its clock's) have learned from first chunks (picker mode).
TOKEN_SIGNALS_BYTES_PER_ENDPOINT = 2800
# Stored responses' holders (fleet/state_holders.py): one id -> endpoint entry (an OrderedDict slot, a tuple with
# its expiry) measured 171 B with tracemalloc over 100,000, plus the id's own string (~86 B for vLLM's
# "resp_" + 16-32 hex digits); the endpoint strings are shared. December 6: 272 B in all over 20,000 ids of 37
# characters.
STATE_HOLDER_BYTES_PER_ENTRY = 300
# A request being decided holds its prompt's token ids (a list of ints) until its decision is announced (then the
# decision drops them; the approximate index keeps the block keys it recorded, one reference per block): per
# token. The ids the sidecar's tokenizer made are 8 B references to the vocabulary's shared ints
# (tokenize/shared_ids.py); a prompt sent pre-tokenized keeps the request's own ints (~40 B a token with the slot):
# the budget takes that worst case, for every request in flight as if each were still being decided.
INFLIGHT_BYTES_PER_TOKEN = 48
# Session affinity (routing/affinity.py): one session's binding (its key string, a UUID's 36 characters; the
# (endpoint, time) tuple and its float; an OrderedDict slot; the endpoint string is the registry's).
# Measured 271 B with tracemalloc over 20,000 sessions.
SESSION_BYTES_PER_ENTRY = 300
# One metric series of a family labelled by endpoint (telemetry/metrics.py; the label strings are shared).
# Measured 146 B with tracemalloc (one series in each of the 22 endpoint-labelled families, 2,000 endpoints);
# an endpoint has ENDPOINT_SERIES of them at most, as budgeted (a second label's every value is a series).
METRIC_SERIES_BYTES = 160
ENDPOINT_SERIES = 48
# One ext_proc stream open after its decision, Python side: its state, reader and writer tasks, the Decision
# and its lease (extproc/stream.py); gRPC's per-call memory is native and not counted.
# Measured 7,824 B with tracemalloc over 500 streams (three tasks and their coroutines' frames, the Decision and
# its candidates, the parsed request).
OPEN_STREAM_BYTES = 8_500
# The same stream's whole cost to the process, gRPC's native per-call memory included: RSS per request held in
# flight (its engine not answering) measured 21.3 KiB over 400 held (research/probes/inflight_footprint.py).
# --max-open-streams bounds how many there are.
OPEN_STREAM_RESIDENT_BYTES = 24 * 1024

# ---- measured fixed costs ----
# The sidecar started and serving, with the repository's tiny tokenizer (measured 77-79 MiB RSS).
BASELINE_BYTES = 80 * MiB
# A production tokenizer loaded on top: a byte-level BPE the size of Qwen2.5's (151,643 tokens, 151,387
# merges) measured +101 MiB RSS, before its table of shared ids (tokenize/shared_ids.py: 151,643 ints and their
# list, measured 6.0 MiB with tracemalloc: 41.5 B an id).
TOKENIZER_BYTES = 128 * MiB
# Streams, gRPC buffers and allocator slack under load: the soak (`make bench BENCH_ARGS="--cases soak"`) at
# minute 10, RSS minus RSS at start minus the caches' own share, measured ~26 MiB. Not covered: the malloc
# heap's slow growth with cancelled streams that docs/memory.md reports.
TRAFFIC_BYTES = 48 * MiB

# ---- the workload the budget is sized for (bounds that depend on traffic, not on a setting) ----
BUDGET_ENDPOINTS = 1_000  # the fleet's size (the ring keeps at most RING_CANDIDATES of each decision's)
BUDGET_INFLIGHT_REQUESTS = 256  # being decided at once, each holding its prompt's ids (the streams: a setting)
BUDGET_PROMPT_TOKENS = 8_192
# The worst case may use at most this share of a container's limit: the rest is margin for what the model
# leaves out (allocator fragmentation over days, request bodies in flight, a burst far above the soak's rate).
LIMIT_SHARE = 0.8


@dataclass(frozen=True)
class Bounds:
    """The bounds a configuration sets (each structure's maximum size, in its own unit)."""

    kv_events_max_blocks: int
    approx_max_blocks: int
    piece_cache_tokens: int
    recent_decisions: int
    endpoints: int = BUDGET_ENDPOINTS
    conversation_cache_bytes: int = CONVERSATION_CACHE_DEFAULT_MB * MiB  # --conversation-cache-mb
    state_max_entries: int = DEFAULT_STATE_ENTRIES  # --state-max-entries
    session_max_entries: int = DEFAULT_SESSION_ENTRIES  # --session-max-entries (counted whether sessions are on)
    # --admission-max-held-bytes when --admission is on (the held bodies), else 0: admission is off by default
    admission_held_bytes: int = 0
    admission_held: int = 0  # --admission-max-held when --admission is on: held streams, outside the stream cap
    open_streams: int = 4096  # --max-open-streams (a stream per request in flight, the held ones included)


def worst_case(bounds: Bounds) -> dict[str, int]:
    """Bytes per part with every bound full at once; sum the values for the total."""
    return {
        "baseline": BASELINE_BYTES,
        "tokenizer": TOKENIZER_BYTES,
        "traffic": TRAFFIC_BYTES,
        "inflight_prompts": BUDGET_INFLIGHT_REQUESTS * BUDGET_PROMPT_TOKENS * INFLIGHT_BYTES_PER_TOKEN,
        "kv_events_index": bounds.kv_events_max_blocks * KV_INDEX_BYTES_PER_BLOCK,
        "approx_index": bounds.approx_max_blocks * APPROX_BYTES_PER_BLOCK,
        "piece_cache": bounds.piece_cache_tokens * PIECE_CACHE_BYTES_PER_TOKEN,
        "conversation_cache": int(bounds.conversation_cache_bytes * CONVERSATION_CACHE_RESIDENT_PER_COUNTED),
        "recent_decisions": bounds.recent_decisions * (
            RECENT_DECISION_BYTES + min(bounds.endpoints, RING_CANDIDATES) * RECENT_CANDIDATE_BYTES),
        "token_signals": bounds.endpoints * TOKEN_SIGNALS_BYTES_PER_ENDPOINT,
        "working_set": 2 * WORKING_SET_MAX_ENTRIES * WORKING_SET_BYTES_PER_ENTRY,
        "queued_prefixes": QUEUED_MAX_BLOCKS * BYTES_PER_QUEUED_BLOCK,
        "state_holders": bounds.state_max_entries * STATE_HOLDER_BYTES_PER_ENTRY,
        "sessions": bounds.session_max_entries * SESSION_BYTES_PER_ENTRY,
        "endpoint_series": bounds.endpoints * ENDPOINT_SERIES * METRIC_SERIES_BYTES,
        "open_streams": bounds.open_streams * OPEN_STREAM_RESIDENT_BYTES,
        "admission_held": bounds.admission_held_bytes + bounds.admission_held * OPEN_STREAM_RESIDENT_BYTES,
    }


def fits(bounds: Bounds, limit_bytes: int) -> bool:
    return sum(worst_case(bounds).values()) <= LIMIT_SHARE * limit_bytes
