"""The sidecar's request path keeps nothing per request: 100,000 requests through the ext_proc servicer in
process (bench/memory_per_request.py's rig: no Envoy, no network), and live memory over the second half grows
by at most a few bytes a request.

The path: the cheapest realistic one, `leastload` on short prompts with no tokenizer, so that 100,000 requests fit
the test's time (its CPU is in docs/results.md); everything else of the request's life is there: completions and
chat, BUFFERED and full duplex (response headers naming the engine that served, a streamed response), session
affinity on half of the requests (its map, bounded small, full after the first few thousand), streams that Envoy
resets while the handler waits and reads that fail because the call is gone, the lifecycle ended for each. The
tokenizer and prefix-source paths are measured by the rig itself (`python -m bench.memory_per_request`,
docs/results.md); the piece cache's own regression has its test (tests/unit/test_token_chunks.py).

The measure: glibc's live malloc (mallinfo2's bytes handed out and not freed, after a full collection and a
heap trim), the figure the soak reports beside RSS. It is stable in process: no gRPC core runs, and
fragmentation or free pages do not count in it (only bytes in use). Python's allocated blocks
(sys.getallocatedblocks) are checked beside it: a leak of small objects lives in Python's own arenas, which
malloc does not see, and shows there as blocks. Traced bytes (tracemalloc) would be the third measure, but
tracing slows the path about threefold.

The first half is the warm-up: every bound the path has is full by then (checked), so what still grows in the
second half is growth per request, not a cache filling.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from bench.memory_per_request import BOUNDS, Mix, RigOptions, measure
from loadaware.collector import malloc_counts

REQUESTS = 100_000
# Over the second half (50,000 requests): 4 B a request is 200 KB, far above what the path keeps now and far
# below what a leak of one object per request costs (a 40-byte string and its list slot: ~60 B and a block).
MALLOC_BYTES_PER_REQUEST = 4.0
BLOCKS_PER_REQUEST = 0.01


def options() -> RigOptions:
    return RigOptions(policy="leastload", sources="", mix=Mix(short=True))


def run(requests: int = REQUESTS, listener: Any = None) -> dict[str, Any]:
    """The rig to the half and to the end; `listener`: one more lifecycle listener (a deliberate leak, to show
    that the check can fail)."""
    return asyncio.run(measure(options(), (requests // 2, requests), listener=listener))


@pytest.mark.skipif(malloc_counts() is None, reason="needs glibc's mallinfo2")
def test_live_memory_per_request_is_flat() -> None:
    result = run()
    half, end = result["samples"]
    growth = result["after_warmup"]
    print(f"\nlive memory over requests {half['requests']:,} to {end['requests']:,}: malloc in use "
          f"{growth['malloc_in_use']:+.2f} B/request (bound {MALLOC_BYTES_PER_REQUEST}), Python blocks "
          f"{growth['py_blocks']:+.4f}/request (bound {BLOCKS_PER_REQUEST}); CPU {end['cpu_s']} s; "
          f"ends {result['ends']}")
    assert half["fill"]["sessions"] == int(BOUNDS["--session-max-entries"])  # the session map full at the half
    assert result["in_flight_after"] == 0
    assert all(result["ends"][k] > 0 for k in ("eof", "reset", "call_gone"))
    assert growth["malloc_in_use"] <= MALLOC_BYTES_PER_REQUEST
    assert growth["py_blocks"] <= BLOCKS_PER_REQUEST
