"""KV events of hybrid models and data-parallel engines: only full-attention groups are prefix credit (the
minimum over them), other groups' stores and removals never touch that credit, and an endpoint with several
data-parallel ranks is credited with the minimum over its ranks."""

from __future__ import annotations

from collections.abc import Iterator

import msgpack
import pytest

from loadaware.config import from_args
from loadaware.fleet.addresses import FeedAddress, parse_feed_address, parse_feed_map
from loadaware.prefix.blocks import BlockIndex
from loadaware.prefix.kvevents.codec import AllBlocksCleared, BlockRemoved, BlockStored, EventBatch, decode_batch
from loadaware.prefix.kvevents.feeds import EngineFeed, FeedOptions, FeedShared, KvEventsFeeds, feed_address
from loadaware.prefix.kvevents.groups import GroupRouter, credited
from loadaware.prefix.kvevents.query import KvEventsPrefixSource
from loadaware.prefix.kvevents.sync import apply_batch
from loadaware.telemetry.metrics import Metrics

BS = 16
PROMPT = list(range(1000, 1000 + 12 * BS))
EP = "10.0.0.1:8000"


def hashes(n: int, tag: str = "p") -> list[bytes]:
    return [f"{tag}{i}".encode() for i in range(n)]


def store(n: int, group: int | None, kind: str | None, tokens: list[int] = PROMPT, tag: str = "p") -> BlockStored:
    """The first n blocks of `tokens` as one chain (vLLM sends the same block hashes in every group)."""
    return BlockStored(tuple(hashes(n, tag)), None, tuple(tokens[:n * BS]), BS, medium="GPU", group_idx=group,
                       kind=kind)


def remove(idx: list[int], group: int | None, tag: str = "p") -> BlockRemoved:
    return BlockRemoved(tuple(f"{tag}{i}".encode() for i in idx), "GPU", group)


@pytest.fixture
def feeds() -> Iterator[KvEventsFeeds]:
    f = KvEventsFeeds(BlockIndex(), Metrics("loadaware"), lambda: ())
    yield f
    f.ctx.destroy(linger=0)


def attach(feeds: KvEventsFeeds, endpoint: str, ranks: tuple[int, ...] = (0,)) -> list[EngineFeed]:
    """Feeds for `endpoint` as sync_endpoints makes them, without running their sockets."""
    address = FeedAddress("tcp://10.0.0.1:5557", "tcp://10.0.0.1:5558", ranks)
    made = [EngineFeed(endpoint, address.for_rank(r), FeedShared(feeds.index, feeds.metrics, feeds.ctx, 1.0), "", r)
            for r in ranks]
    feeds.attach(endpoint, made)
    return made


def credit(feeds: KvEventsFeeds, tokens: list[int] = PROMPT, endpoints: tuple[str, ...] = (EP,)) -> dict[str, int]:
    return KvEventsPrefixSource(feeds.index, feeds).lookup(tokens, endpoints)


# ---- the codec ----
def test_map_layout_carries_groups_kinds_and_rank() -> None:
    payload = msgpack.packb({"ts": 1.0, "data_parallel_rank": 2, "events": [
        {"type": "BlockStored", "block_hashes": [b"a"], "parent_block_hash": None, "token_ids": list(range(16)),
         "block_size": 16, "lora_id": None, "medium": "GPU", "lora_name": None, "group_idx": 1,
         "kv_cache_spec_kind": "sliding_window", "kv_cache_spec_sliding_window": 4096},
        {"type": "BlockRemoved", "block_hashes": [b"a"], "medium": "GPU", "group_idx": 1}]}, use_bin_type=True)
    batch = decode_batch(payload)
    stored, removed = batch.events
    assert isinstance(stored, BlockStored)
    assert (stored.group_idx, stored.kind, stored.sliding_window) == (1, "sliding_window", 4096)
    assert removed == BlockRemoved((b"a",), "GPU", 1)
    assert batch.data_parallel_rank == 2


def test_array_layout_puts_the_group_fields_after_extra_keys() -> None:
    payload = msgpack.packb([0.0, [["BlockStored", [b"a"], None, list(range(16)), 16, None, "GPU", None, None, 3,
                                    "mamba"], ["BlockRemoved", [b"a"], "GPU", 3]]], use_bin_type=True)
    stored, removed = decode_batch(payload).events
    assert isinstance(stored, BlockStored) and (stored.group_idx, stored.kind) == (3, "mamba")
    assert removed == BlockRemoved((b"a",), "GPU", 3)


@pytest.mark.parametrize(("kind", "yes"), [
    ("full_attention", True), ("mla_attention", True), ("sink_full_attention", True), (None, True),
    ("sliding_window", False), ("sliding_window_mla", False), ("chunked_local_attention", False),
    ("mamba", False), ("cross_attention", False), ("encoder_only_attention", False), ("unknown", False)])
def test_which_kinds_are_prefix_credit(kind: str | None, yes: bool) -> None:
    assert credited(kind) is yes


# ---- the index ----
def test_sliding_window_and_mamba_blocks_are_never_credited(feeds: KvEventsFeeds) -> None:
    (f,) = attach(feeds, EP)
    counts = apply_batch(feeds.index, f.router, [store(12, 1, "sliding_window"), store(12, 2, "mamba")])
    assert counts.stored == 0 and counts.uncredited == 24
    assert credit(feeds) == {} and feeds.index.total_blocks == 0
    apply_batch(feeds.index, f.router, [store(4, 0, "full_attention")])
    assert credit(feeds) == {EP: 4 * BS}  # the full-attention prefix, not the 12 blocks the others hold


def test_a_pure_sliding_window_or_mamba_model_earns_nothing(feeds: KvEventsFeeds) -> None:
    (f,) = attach(feeds, EP)
    apply_batch(feeds.index, f.router, [store(12, 0, "sliding_window")])
    assert credit(feeds) == {}
    assert f.router.kinds == {0: "sliding_window"}


def test_removals_in_other_groups_keep_the_full_attention_credit(feeds: KvEventsFeeds) -> None:
    """The same block hash sits in every group; a sliding window drops its old blocks all the time. Before
    groups were told apart, such a removal dropped the full-attention block too."""
    (f,) = attach(feeds, EP)
    apply_batch(feeds.index, f.router, [store(12, 0, "full_attention"), store(12, 1, "sliding_window")])
    apply_batch(feeds.index, f.router, [remove(list(range(10)), 1)])
    assert credit(feeds) == {EP: 12 * BS}
    apply_batch(feeds.index, f.router, [remove([5], 0)])
    assert credit(feeds) == {EP: 5 * BS}


def test_several_full_attention_groups_credit_their_minimum(feeds: KvEventsFeeds) -> None:
    (f,) = attach(feeds, EP)
    apply_batch(feeds.index, f.router, [store(12, 0, "full_attention"), store(12, 1, "mamba"),
                                        store(7, 2, "full_attention")])
    assert f.router.credited_parts() == (EP, f"{EP}#g2")
    assert credit(feeds) == {EP: 7 * BS}
    apply_batch(feeds.index, f.router, [remove([3], 2)])
    assert credit(feeds) == {EP: 3 * BS}
    apply_batch(feeds.index, f.router, [remove([0], 0)])  # one group lost the first block: no hit at all
    assert credit(feeds) == {}


def test_a_removal_before_its_group_is_known_touches_nothing(feeds: KvEventsFeeds) -> None:
    (f,) = attach(feeds, EP)
    apply_batch(feeds.index, f.router, [store(6, 0, "full_attention")])
    counts = apply_batch(feeds.index, f.router, [remove([0, 1], 4)])
    assert counts.removed == 0 and counts.uncredited == 2 and credit(feeds) == {EP: 6 * BS}


def test_all_blocks_cleared_and_a_restart_drop_every_group(feeds: KvEventsFeeds) -> None:
    (f,) = attach(feeds, EP)
    apply_batch(feeds.index, f.router, [store(6, 0, "full_attention"), store(6, 3, "mla_attention")])
    assert credit(feeds) == {EP: 6 * BS}
    counts = apply_batch(feeds.index, f.router, [AllBlocksCleared()])
    assert counts.cleared == 12 and feeds.index.total_blocks == 0 and credit(feeds) == {}
    apply_batch(feeds.index, f.router, [store(6, 0, "full_attention"), store(6, 3, "mla_attention")])
    assert f.router.credited_parts() == (EP, f"{EP}#g3")
    f.reset("sequence_reset")  # a restarted engine may have another group layout: the groups are forgotten
    assert feeds.index.total_blocks == 0 and f.router.credited_parts() == (EP,) and EP not in feeds.split
    apply_batch(feeds.index, f.router, [store(6, 0, "full_attention")])
    assert credit(feeds) == {EP: 6 * BS}  # no stale empty part for group 3 denies the credit


def test_groupless_and_group_0_are_one_part() -> None:
    router = GroupRouter("a")
    index = BlockIndex()
    apply_batch(index, router, [store(3, None, None), store(3, 0, "full_attention")])
    assert router.credited_parts() == ("a",)


def test_a_group_that_turns_out_uncredited_loses_its_blocks(feeds: KvEventsFeeds) -> None:
    """A restarted engine serving another model may reuse a group index for another kind."""
    (f,) = attach(feeds, EP)
    apply_batch(feeds.index, f.router, [store(6, 0, "full_attention"), store(6, 1, "full_attention")])
    apply_batch(feeds.index, f.router, [store(6, 1, "sliding_window", tag="q")])
    assert f.router.credited_parts() == (EP,) and feeds.index.blocks(f"{EP}#g1") == 0
    assert credit(feeds) == {EP: 6 * BS}


def test_groupless_events_are_full_attention_as_before() -> None:
    index = BlockIndex()
    apply_batch(index, "a", [store(5, None, None)])
    apply_batch(index, "a", [remove([4], None)])  # a fresh router per call still finds the engine's blocks
    assert KvEventsPrefixSource(index).lookup(PROMPT, ("a",)) == {"a": 4 * BS}


# ---- data-parallel ranks ----
def test_an_endpoint_with_ranks_is_credited_with_their_minimum(feeds: KvEventsFeeds) -> None:
    r0, r1 = attach(feeds, EP, (0, 1))
    assert (r0.endpoint, r1.endpoint) == (EP, f"{EP}#dp1")
    assert r1.address == FeedAddress("tcp://10.0.0.1:5558", "tcp://10.0.0.1:5559")
    r0._apply(0, EventBatch(0.0, (store(10, 0, "full_attention"),), 0), live=True)
    assert credit(feeds) == {}  # rank 1 holds nothing: a request it gets would miss
    r1._apply(0, EventBatch(0.0, (store(4, 0, "full_attention"), store(12, 1, "sliding_window")), 1), live=True)
    assert credit(feeds) == {EP: 4 * BS}
    assert feeds.parts(EP) == (EP, f"{EP}#dp1")
    r1.reset("vanished")
    assert credit(feeds) == {} and feeds.index.blocks(EP) == 10


def test_a_batch_from_another_rank_is_not_applied(feeds: KvEventsFeeds) -> None:
    (f,) = attach(feeds, EP)
    f._apply(0, EventBatch(0.0, (store(10, 0, "full_attention"),), 3), live=True)
    assert feeds.index.total_blocks == 0 and f.rank_mismatches == 1 and f.sync.last == 0
    f._apply(1, EventBatch(0.0, (store(10, 0, "full_attention"),), None), live=True)  # no rank: accepted
    assert credit(feeds) == {EP: 10 * BS}


def test_removed_endpoint_drops_every_rank_and_group(feeds: KvEventsFeeds) -> None:
    r0, r1 = attach(feeds, EP, (0, 1))
    apply_batch(feeds.index, r0.router, [store(5, 0, "full_attention"), store(5, 2, "full_attention")])
    apply_batch(feeds.index, r1.router, [store(5, 0, "full_attention")])
    assert feeds.index.total_blocks == 15
    feeds.remove(EP)
    assert feeds.index.total_blocks == 0 and feeds.index.engines() == []


def test_rank_ports_and_settings() -> None:
    a = parse_feed_address("10.0.0.1:5557/5558@2-3")
    assert a.ranks == (2, 3) and a.for_rank(3) == FeedAddress("tcp://10.0.0.1:5560", "tcp://10.0.0.1:5561")
    assert parse_feed_address("10.0.0.1:5557@1").ranks == (1,)
    assert parse_feed_address("10.0.0.1:5557").ranks is None
    for bad in ("10.0.0.1:5557@3-1", "10.0.0.1:65535@0-1", "10.0.0.1:5557@x"):
        with pytest.raises(ValueError):
            parse_feed_address(bad)
    assert parse_feed_map("10.0.0.1:8000=10.0.0.1:5557/5558@0-1")["10.0.0.1:8000"].ranks == (0, 1)
    assert from_args(["--kv-events-dp-ranks", "4"], environ={}).kv_events_dp_ranks == 4
    assert from_args([], environ={}).kv_events_dp_ranks == 1
    derived = feed_address("10.0.0.1:8000", {}, 5557, 5558)
    assert derived is not None and derived.ranks is None and derived.for_rank(2).pub == "tcp://10.0.0.1:5559"
    derived = feed_address("[fd00::1]:8000", {}, 5557, 5558)  # an IPv6 engine's feed, bracketed for ZMQ
    assert derived == FeedAddress("tcp://[fd00::1]:5557", "tcp://[fd00::1]:5558")
    assert derived.for_rank(1) == FeedAddress("tcp://[fd00::1]:5558", "tcp://[fd00::1]:5559")


async def test_sync_endpoints_starts_one_feed_per_rank() -> None:
    feeds = KvEventsFeeds(BlockIndex(), Metrics("loadaware"), lambda: (), FeedOptions({"10.0.0.9:8000": FeedAddress(
        "tcp://127.0.0.1:1", None, (0, 2))}, 5557, 0, dp_ranks=3))
    try:
        feeds.sync_endpoints(["10.0.0.9:8000", "10.0.0.8:8000"])
        assert [f.rank for f in feeds.feeds["10.0.0.9:8000"]] == [0, 2]  # the explicit ranks
        assert [f.address.pub for f in feeds.feeds["10.0.0.8:8000"]] == [
            "tcp://10.0.0.8:5557", "tcp://10.0.0.8:5558", "tcp://10.0.0.8:5559"]
        assert feeds.covered(["10.0.0.9:8000", "10.0.0.8:8000"]) == set()
        state = feeds.state()["engines"]
        assert isinstance(state, dict) and set(state["10.0.0.8:8000"]["ranks"]) == {"0", "1", "2"}
    finally:
        await feeds.close()
