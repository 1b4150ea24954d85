"""Decoding vLLM KV-event batches: both hash encodings, both msgspec layouts, newer trailing fields."""

from __future__ import annotations

import msgpack
import pytest

from loadaware.prefix.kvevents.codec import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    DecodeError,
    decode_batch,
    decode_seq,
)
from sim.kv_events_publisher import KvEventsPublisher
from sim.prefix_cache import PrefixCache


def pack(obj: object) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def test_array_like_batch_with_int_hashes() -> None:
    payload = pack([1.5, [["BlockStored", [11, 12], None, list(range(32)), 16, None, "GPU", None],
                          ["BlockRemoved", [11], "GPU"], ["AllBlocksCleared"]], 0])
    batch = decode_batch(payload)
    assert batch.ts == 1.5 and batch.data_parallel_rank == 0 and batch.skipped == 0
    stored, removed, cleared = batch.events
    assert stored == BlockStored((11, 12), None, tuple(range(32)), 16, None, "GPU", None, None)
    assert removed == BlockRemoved((11,), "GPU")
    assert cleared == AllBlocksCleared()


def test_bytes_hashes_and_newer_trailing_fields() -> None:
    h1, h2 = b"\x01" * 32, b"\x02" * 32
    # vLLM >= 0.11: lora_name, extra_keys, group_idx, kv_cache_spec_kind, ... appended; BlockRemoved too
    payload = pack([2.0, [["BlockStored", [h2], h1, list(range(16)), 16, None, "CPU", None, [None], 0,
                           "full_attention", None, "future-field"],
                          ["BlockRemoved", [h1], "CPU", 0, "another-future-field"]], 3, "trailing"])
    batch = decode_batch(payload)
    stored, removed = batch.events
    assert isinstance(stored, BlockStored) and stored.block_hashes == (h2,) and stored.parent_block_hash == h1
    assert stored.medium == "CPU" and stored.extra_keys == (None,) and stored.extra() is None
    assert removed == BlockRemoved((h1,), "CPU", 0)
    assert (stored.group_idx, stored.kind) == (0, "full_attention")
    assert batch.data_parallel_rank == 3


def test_older_batches_without_rank_or_medium() -> None:
    payload = pack([3.0, [["BlockStored", [5], 4, list(range(16)), 16, None], ["BlockRemoved", [5]]]])
    batch = decode_batch(payload)
    assert batch.data_parallel_rank is None
    assert batch.events[0] == BlockStored((5,), 4, tuple(range(16)), 16)
    assert batch.events[1] == BlockRemoved((5,), None)


def test_map_layout_tagged_by_type() -> None:
    payload = pack({"ts": 4.0, "events": [
        {"type": "BlockStored", "block_hashes": [7], "parent_block_hash": None, "token_ids": list(range(16)),
         "block_size": 16, "lora_id": None, "medium": "GPU", "lora_name": None, "group_idx": 1},
        {"type": "BlockRemoved", "block_hashes": [7], "medium": "GPU"},
        {"type": "AllBlocksCleared"}], "data_parallel_rank": 1})
    batch = decode_batch(payload)
    assert [type(e).__name__ for e in batch.events] == ["BlockStored", "BlockRemoved", "AllBlocksCleared"]
    assert batch.events[0].block_hashes == (7,)  # type: ignore[union-attr]


def test_unknown_and_malformed_events_are_skipped_not_fatal() -> None:
    payload = pack([5.0, [["SomethingNew", 1, 2], ["BlockStored", "not-a-list"], 42,
                          ["BlockRemoved", [9], "GPU"]], 0])
    batch = decode_batch(payload)
    assert batch.events == (BlockRemoved((9,), "GPU"),) and batch.skipped == 3


def test_lora_and_extra_keys_mark_blocks_as_not_plain_tokens() -> None:
    """extra() is per block, aligned with block_hashes; None for a plain block."""
    lora = decode_batch(pack([0, [["BlockStored", [1], None, list(range(16)), 16, 3, "GPU", "adapter"]]]))
    assert lora.events[0].extra() == ((("lora", "adapter"), None),)  # type: ignore[union-attr]
    mm = decode_batch(pack([0, [["BlockStored", [1, 2], None, list(range(32)), 16, None, "GPU", None,
                                 [["img-hash", 0], None]]]]))
    assert mm.events[0].extra() == (("img-hash", 0), None)  # type: ignore[union-attr]
    # entries that do not line up with the blocks mark every block (never credited rather than misread)
    odd = decode_batch(pack([0, [["BlockStored", [1, 2], None, list(range(32)), 16, None, "GPU", None, [["s"]]]]]))
    extra = odd.events[0].extra()  # type: ignore[union-attr]
    assert extra is not None and len(extra) == 2 and None not in extra


@pytest.mark.parametrize("payload", [b"\xc1", pack("text"), pack([1.0]), pack([1.0, "x"]), pack({"ts": 1})])
def test_garbage_raises_decode_error(payload: bytes) -> None:
    with pytest.raises(DecodeError):
        decode_batch(payload)


def test_sequence_frames() -> None:
    assert decode_seq((41).to_bytes(8, "big")) == 41
    assert decode_seq((-1).to_bytes(8, "big", signed=True)) == -1
    with pytest.raises(DecodeError):
        decode_seq(b"\x00\x01")


@pytest.mark.parametrize("hash_format", ["int", "bytes"])
def test_the_simulators_batches_decode(hash_format: str) -> None:
    """The simulated engines' publisher encodes independently; its batches must decode to the cache's truth."""
    pub = KvEventsPublisher("127.0.0.1", 0, None, block_size=16, hash_format=hash_format)
    cache = PrefixCache(capacity_blocks=4, block_size=16)
    cache.add_observer(pub)
    cache.insert(list(range(48)))  # 3 blocks
    cache.insert(list(range(100, 148)))  # 3 more: 2 evicted
    cache.clear()
    batches = [decode_batch(payload) for _, payload in pub._buffer]
    events = [e for b in batches for e in b.events]
    kinds = [type(e).__name__ for e in events]
    assert kinds == ["BlockStored", "BlockStored", "BlockRemoved", "AllBlocksCleared"]
    first = events[0]
    assert isinstance(first, BlockStored) and len(first.block_hashes) == 3 and first.parent_block_hash is None
    assert first.token_ids == tuple(range(48)) and first.block_size == 16 and first.medium == "GPU"
    assert all(isinstance(h, int if hash_format == "int" else bytes) for h in first.block_hashes)
