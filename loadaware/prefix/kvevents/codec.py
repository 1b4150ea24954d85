"""Decode vLLM's KV-event batches (the third frame of each ZMQ message). Pure, tolerant, no vLLM import.

vLLM encodes with msgspec (`vllm/distributed/kv_events.py`): `KVEventBatch` = `ts, events,
data_parallel_rank`, each event a tagged struct — `BlockStored` (block_hashes, parent_block_hash, token_ids,
block_size, lora_id, medium, lora_name, then optional newer fields: extra_keys, group_idx, ...),
`BlockRemoved` (block_hashes, medium, group_idx...), `AllBlocksCleared`. Versions differ in ways a consumer
must survive, so this decoder accepts all of them:
- structs as arrays (`array_like=True`: the tag first, then the fields in order) or as maps (the tag under
  "type", fields by name);
- block hashes as ints or as bytes (vLLM >= 0.10 sends sha256 bytes);
- fields appended by newer versions (ignored unless known), and fields omitted by older ones (defaults).
An unknown event tag is skipped and counted, never fatal.

Hybrid models: `group_idx` (which KV-cache group the blocks belong to) and, on stores only,
`kv_cache_spec_kind` (the group's kind as a string: "full_attention", "sliding_window", "mamba", ...) and
`kv_cache_spec_sliding_window`; a removal names only its group (see kvevents/groups.py for what is credited).
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

import msgpack

from loadaware.prefix.blocks import EngineHash


class DecodeError(ValueError):
    """The payload is not a KV-event batch at all."""


@dataclass(frozen=True, slots=True)
class BlockStored:
    block_hashes: tuple[EngineHash, ...]
    parent_block_hash: EngineHash | None
    token_ids: tuple[int, ...]
    block_size: int
    lora_id: int | None = None
    medium: str | None = None
    lora_name: str | None = None
    extra_keys: tuple[Hashable, ...] | None = None  # one entry (or None) per block
    group_idx: int | None = None  # the KV-cache group (None: a vLLM without groups)
    kind: str | None = None  # kv_cache_spec_kind of that group (None: not sent)
    sliding_window: int | None = None  # kv_cache_spec_sliding_window

    def extra(self) -> tuple[Hashable, ...] | None:
        """Per block (aligned with block_hashes): what besides its tokens the block's KV depends on, None for
        a plain block; None overall when every block is plain (see blocks.block_key).

        vLLM's `extra_keys` entry for a block is exactly the extra-keys tuple it hashed the block with: the
        LoRA name, multimodal (identifier, offset) pairs, the `cache_salt` (first block of a sequence only)
        and prompt-embedding hashes, in that order; None when there are none. A LoRA adapter named only by
        `lora_name` / `lora_id` (vLLM before `extra_keys`) marks every block too. Entries that do not line up
        with the blocks mark every block: such blocks are never credited rather than credited wrongly."""
        lora = self.lora_name if self.lora_name is not None else self.lora_id
        n = len(self.block_hashes)
        keys = self.extra_keys
        if keys is not None and not any(e is not None for e in keys):
            keys = None
        if keys is not None and len(keys) != n:
            keys = (("unaligned_extra_keys", keys),) * n
        if lora is None:
            return keys
        return tuple((("lora", lora), None if keys is None else keys[i]) for i in range(n))


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    block_hashes: tuple[EngineHash, ...]
    medium: str | None = None
    group_idx: int | None = None


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    pass


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared


@dataclass(frozen=True, slots=True)
class EventBatch:
    ts: float
    events: tuple[KVEvent, ...]
    data_parallel_rank: int | None = None
    skipped: int = 0  # events with an unknown tag or a malformed body


_STORED_FIELDS = ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium",
                  "lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind", "kv_cache_spec_sliding_window")
_REMOVED_FIELDS = ("block_hashes", "medium", "group_idx")


def _hash(value: Any) -> EngineHash:
    if isinstance(value, (int, bytes)) and not isinstance(value, bool):
        return value
    if isinstance(value, bytearray):
        return bytes(value)
    raise DecodeError(f"block hash of type {type(value).__name__}")


def _fields(body: Any, names: tuple[str, ...]) -> dict[str, Any]:
    if isinstance(body, dict):
        return {k: body.get(k) for k in names}
    if isinstance(body, (list, tuple)):  # array_like: positional, extra trailing fields ignored
        return {k: (body[i] if i < len(body) else None) for i, k in enumerate(names)}
    raise DecodeError("event body is neither an array nor a map")


def _opt_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _opt_str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _hashable(value: Any) -> Hashable:
    if isinstance(value, list):
        return tuple(_hashable(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((str(k), _hashable(v)) for k, v in value.items()))
    return value


def _stored(body: Any) -> BlockStored:
    f = _fields(body, _STORED_FIELDS)
    hashes, tokens, size = f["block_hashes"], f["token_ids"], f["block_size"]
    if not isinstance(hashes, list) or not isinstance(tokens, list) or not isinstance(size, int):
        raise DecodeError("BlockStored without block_hashes / token_ids / block_size")
    parent = f["parent_block_hash"]
    extra = f["extra_keys"]
    medium = f["medium"]
    lora_name = f["lora_name"]
    return BlockStored(
        tuple(_hash(h) for h in hashes), None if parent is None else _hash(parent), tuple(tokens), size,
        f["lora_id"] if isinstance(f["lora_id"], int) else None,
        medium if isinstance(medium, str) else None,
        lora_name if isinstance(lora_name, str) else None,
        tuple(_hashable(e) for e in extra) if isinstance(extra, list) else None,
        _opt_int(f["group_idx"]), _opt_str(f["kv_cache_spec_kind"]), _opt_int(f["kv_cache_spec_sliding_window"]))


def _removed(body: Any) -> BlockRemoved:
    f = _fields(body, _REMOVED_FIELDS)
    if not isinstance(f["block_hashes"], list):
        raise DecodeError("BlockRemoved without block_hashes")
    medium = f["medium"]
    return BlockRemoved(tuple(_hash(h) for h in f["block_hashes"]), medium if isinstance(medium, str) else None,
                        _opt_int(f["group_idx"]))


def _tag(event: Any) -> tuple[str | None, Any]:
    """(tag, body): an array's first item, or a map's "type" entry."""
    if isinstance(event, (list, tuple)) and event and isinstance(event[0], str):
        return event[0], list(event[1:])
    if isinstance(event, dict):
        tag = event.get("type")
        return (tag if isinstance(tag, str) else None), event
    return None, None


def decode_event(event: Any) -> KVEvent | None:
    """One event, or None for an unknown tag. Raises DecodeError for a known tag with a bad body."""
    tag, body = _tag(event)
    if tag == "BlockStored":
        return _stored(body)
    if tag == "BlockRemoved":
        return _removed(body)
    if tag == "AllBlocksCleared":
        return AllBlocksCleared()
    return None


def decode_batch(payload: bytes) -> EventBatch:
    try:
        raw = msgpack.unpackb(payload, raw=False, strict_map_key=False, use_list=True)
    except (ValueError, msgpack.UnpackException) as exc:
        raise DecodeError(f"not msgpack: {exc}") from None
    if isinstance(raw, dict):
        ts, events, rank = raw.get("ts"), raw.get("events"), raw.get("data_parallel_rank")
    elif isinstance(raw, list) and len(raw) >= 2:
        ts, events = raw[0], raw[1]
        rank = raw[2] if len(raw) > 2 else None
    else:
        raise DecodeError("batch is neither [ts, events, ...] nor a map")
    if not isinstance(events, list) or not isinstance(ts, (int, float)):
        raise DecodeError("batch without ts / events")
    out: list[KVEvent] = []
    skipped = 0
    for event in events:
        try:
            decoded = decode_event(event)
        except (DecodeError, TypeError, IndexError):
            decoded = None
        if decoded is None:
            skipped += 1
        else:
            out.append(decoded)
    return EventBatch(float(ts), tuple(out), rank if isinstance(rank, int) else None, skipped)


def decode_seq(frame: bytes) -> int:
    """The 8-byte big-endian sequence number; the replay's end marker decodes as -1."""
    if len(frame) != 8:
        raise DecodeError(f"sequence frame of {len(frame)} bytes")
    return int.from_bytes(frame, "big", signed=True)
