"""Publish one simulated engine's prefix-cache changes as vLLM KV events, on vLLM's wire format.

Written from vLLM's `vllm/distributed/kv_events.py` (ZmqEventPublisher), independently of the sidecar's
decoder so that tests of the pair catch a misread format:
- PUB socket, three frames per message: topic, 8-byte big-endian sequence number (from 0), payload;
- payload = msgpack of `KVEventBatch`, by default with msgspec's `array_like=True` layout (older vLLM):
  `[ts, [events...], dp_rank]`, each event a tagged array: `["BlockStored", block_hashes, parent_block_hash,
  token_ids, block_size, lora_id, medium, lora_name(, extra_keys)]`, `["BlockRemoved", block_hashes, medium]`,
  `["AllBlocksCleared"]`; or, with `layout="map"`, msgspec's default struct layout (current vLLM): maps by
  field name, each event tagged by its "type";
- `extra_keys` (vLLM PR #33304): one entry per stored block, the extra keys hashed into it (here a cache
  salt's `(salt,)` on a sequence's first block, else None); omitted when every entry is None, as msgspec's
  `omit_defaults` does;
- ROUTER replay socket: a request `[identity, b"", start_seq(8 bytes)]` is answered with every buffered batch
  from start_seq, `[identity, b"", seq, payload]`, then `[identity, b"", (-1 as 8 signed bytes), b""]`;
- a bounded replay buffer (vLLM's `buffer_steps`);
- hybrid models (`groups=[(group_idx, kind, sliding_window), ...]`): every store and removal is published
  once per KV-cache group, as vLLM's block pool does (the same block hashes in each group), stores with
  `group_idx`, `kv_cache_spec_kind` (the KVCacheSpecKind string) and `kv_cache_spec_sliding_window`,
  removals with `group_idx` only; `remove_in_group` publishes one group's removal alone (a sliding window
  freeing blocks that left its window, a mamba group dropping states);
- data parallelism: the engine's `data_parallel_rank` in every batch (the ports are the caller's: vLLM
  binds rank r on the configured ports + r).
Like vLLM, one batch carries the events of one engine step (here: one event-loop iteration).

Block hashes are the simulator's own chained keys (ints), or their 8-byte big-endian form with
`hash_format="bytes"` (newer vLLM versions send bytes). Test hooks: `drop_next(n)` loses n batches on the
PUB socket (they stay in the replay buffer, as a real network loss would), `restart()` starts the sequence
over as a restarted engine does.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Sequence
from typing import Any

import msgpack
import zmq
import zmq.asyncio

from loadaware.fleet.addresses import tcp_url, url_host
from sim.prefix_cache import AllBlocksCleared, BlocksRemoved, BlocksStored, CacheEvent

log = logging.getLogger(__name__)

END_SEQ = (-1).to_bytes(8, "big", signed=True)


class KvEventsPublisher:
    def __init__(self, ip: str, port: int, replay_port: int | None, block_size: int, topic: str = "",
                 medium: str = "GPU", hash_format: str = "int", buffer_steps: int = 10_000,
                 data_parallel_rank: int = 0, layout: str = "array",
                 groups: Sequence[tuple[int, str, int | None]] | None = None, connect: str | None = None) -> None:
        if hash_format not in ("int", "bytes"):
            raise ValueError("hash_format must be 'int' or 'bytes'")
        if layout not in ("array", "map"):
            raise ValueError("layout must be 'array' or 'map'")
        self.layout = layout
        self.groups = tuple(groups) if groups else None
        self.connect = connect  # vLLM's `endpoint: tcp://HOST:PORT`: connect the PUB to a subscriber that binds
        self.ip = ip
        self.port = port
        self.replay_port = replay_port
        self.block_size = block_size
        self.topic = topic.encode()
        self.medium = medium
        self.hash_format = hash_format
        self.rank = data_parallel_rank
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self._pending: list[list[Any]] = []
        self._flush_scheduled = False
        self._seq = 0
        self._drop = 0
        self._ctx = zmq.asyncio.Context.instance()
        self._pub: zmq.asyncio.Socket | None = None
        self._replay: zmq.asyncio.Socket | None = None
        self._replay_task: asyncio.Task[None] | None = None
        self.published = 0
        self.replays_served = 0

    @property
    def _host_url(self) -> str:
        """tcp://HOST without a port (IPv6 bracketed), as bind_to_random_port takes it."""
        return f"tcp://{url_host(self.ip)}"

    # ---- lifecycle ----
    def start(self) -> None:
        pub = self._ctx.socket(zmq.PUB)
        pub.setsockopt(zmq.LINGER, 0)
        pub.setsockopt(zmq.SNDHWM, 100_000)
        pub.setsockopt(zmq.IPV6, 1)  # binds tcp://[::1]:port too
        if self.connect is not None:
            pub.connect(self.connect)
        elif self.port == 0:
            self.port = pub.bind_to_random_port(self._host_url)
        else:
            pub.bind(tcp_url(self.ip, self.port))
        self._pub = pub
        if self.replay_port is not None:
            router = self._ctx.socket(zmq.ROUTER)
            router.setsockopt(zmq.LINGER, 0)
            router.setsockopt(zmq.IPV6, 1)
            if self.replay_port == 0:
                self.replay_port = router.bind_to_random_port(self._host_url)
            else:
                router.bind(tcp_url(self.ip, self.replay_port))
            self._replay = router
            self._replay_task = asyncio.create_task(self._serve_replays(), name=f"kv-replay-{self.ip}")

    async def stop(self) -> None:
        self.flush()
        if self._replay_task is not None:
            self._replay_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._replay_task
        for sock in (self._pub, self._replay):
            if sock is not None:
                sock.close(linger=0)
        self._pub = self._replay = None

    def describe(self) -> dict[str, Any]:
        return {"kv_events_port": self.port, "kv_events_replay_port": self.replay_port}

    # ---- the prefix cache's observer ----
    def __call__(self, event: CacheEvent) -> None:
        if isinstance(event, BlocksStored):
            # One BlockStored per run of consecutive blocks whose parent chain is continuous, as vLLM does.
            runs: list[list[Any]] = []
            for block in event.blocks:
                if not runs or block.parent != runs[-1][-1].key:
                    runs.append([])
                runs[-1].append(block)
            for group in self.groups or (None,):
                self._pending.extend(self._stored(run, group) for run in runs)
        elif isinstance(event, BlocksRemoved):
            for group in self.groups or (None,):
                self._pending.append(self._removed(event.keys, None if group is None else group[0]))
        elif isinstance(event, AllBlocksCleared):
            self._pending.append(self._event("AllBlocksCleared"))
        if not self._flush_scheduled:
            self._flush_scheduled = True
            try:
                asyncio.get_running_loop().call_soon(self.flush)
            except RuntimeError:  # no loop (a pure unit test): publish at once
                self.flush()

    def _hash(self, key: int) -> int | bytes:
        return key if self.hash_format == "int" else key.to_bytes(8, "big", signed=True)

    def _event(self, tag: str, **fields: Any) -> Any:
        """One tagged event in the configured layout; `fields` in vLLM's declaration order."""
        if self.layout == "map":
            return {"type": tag, **fields}
        return [tag, *fields.values()]

    def _removed(self, keys: Sequence[int], group_idx: int | None) -> Any:
        group: dict[str, Any] = {} if group_idx is None else {"group_idx": group_idx}
        return self._event("BlockRemoved", block_hashes=[self._hash(k) for k in keys], medium=self.medium, **group)

    def _stored(self, blocks: list[Any], group: tuple[int, str, int | None] | None = None) -> Any:
        parent = blocks[0].parent
        tokens = [t for b in blocks for t in b.tokens]
        extra: dict[str, Any] = {}
        if any(b.extra is not None for b in blocks):
            extra["extra_keys"] = [None if b.extra is None else list(b.extra) for b in blocks]
        if group is not None:
            extra.setdefault("extra_keys", None)  # positional in the array layout: keep the slot
            extra.update(group_idx=group[0], kv_cache_spec_kind=group[1])
            if group[2] is not None:
                extra["kv_cache_spec_sliding_window"] = group[2]
        return self._event("BlockStored", block_hashes=[self._hash(b.key) for b in blocks],
                           parent_block_hash=None if parent is None else self._hash(parent), token_ids=tokens,
                           block_size=self.block_size, lora_id=None, medium=self.medium, lora_name=None, **extra)

    def flush(self) -> None:
        self._flush_scheduled = False
        if not self._pending:
            return
        events, self._pending = self._pending, []
        batch: Any = [time.time(), events, self.rank] if self.layout == "array" else \
            {"ts": time.time(), "events": events, "data_parallel_rank": self.rank}
        payload = msgpack.packb(batch, use_bin_type=True)
        seq = self._seq
        self._seq += 1
        self._buffer.append((seq, payload))
        if self._drop > 0:
            self._drop -= 1
            return
        if self._pub is not None:
            try:
                self._pub.send_multipart([self.topic, seq.to_bytes(8, "big"), payload], flags=zmq.NOBLOCK)
                self.published += 1
            except zmq.ZMQError as exc:  # PUB drops at the high-water mark; the replay buffer still has it
                log.warning("kv-events publish dropped seq %d: %r", seq, exc)

    # ---- replay ----
    async def _serve_replays(self) -> None:
        assert self._replay is not None
        while True:
            frames = await self._replay.recv_multipart()
            if len(frames) != 3:
                log.warning("invalid replay request: %d frames", len(frames))
                continue
            identity, _, start_bytes = frames
            start = int.from_bytes(start_bytes, "big", signed=True)
            for seq, payload in list(self._buffer):
                if seq >= start:
                    await self._replay.send_multipart([identity, b"", seq.to_bytes(8, "big"), payload])
            await self._replay.send_multipart([identity, b"", END_SEQ, b""])
            self.replays_served += 1

    # ---- test hooks ----
    def remove_in_group(self, group_idx: int, keys: Sequence[int]) -> None:
        """One KV-cache group frees blocks the others keep (published with the next flush)."""
        self._pending.append(self._removed(keys, group_idx))

    def drop_next(self, n: int) -> None:
        self._drop += n

    def restart(self) -> None:
        """A new publisher: numbering from 0, an empty replay buffer (the cache's clear is separate)."""
        self.flush()
        self._seq = 0
        self._buffer.clear()

    @property
    def next_seq(self) -> int:
        return self._seq
