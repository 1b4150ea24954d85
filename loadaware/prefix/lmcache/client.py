"""The LMCache controller's HTTP API: prefix lookups (hot path, time-boxed, on a lean keep-alive client) and
worker-info queries (background, for the instance-id bridge)."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Sequence
from typing import Any

import aiohttp
from yarl import URL

from loadaware.prefix.lmcache.bridge import WorkerRecord
from loadaware.prefix.lmcache.http1 import HttpError, KeepAliveClient
from loadaware.prefix.source import PrefixUnavailable

log = logging.getLogger(__name__)

LMCACHE_CHUNK_TOKENS = 256  # the controller's ChunkedTokenDatabase default (lmcache 0.5.6)
LookupFailed = PrefixUnavailable  # reasons: lmcache_timeout, lmcache_error, lmcache_bad_reply


def parse_layout(body: Any) -> dict[str, int]:
    """`{"layout_info": {"<instance>": ["LocalCPUBackend", <end_token>]}}` -> {instance: end_token}."""
    if not isinstance(body, dict) or not isinstance(body.get("layout_info"), dict):
        raise LookupFailed("lmcache_bad_reply", "no layout_info")
    out: dict[str, int] = {}
    for instance_id, entry in body["layout_info"].items():
        if isinstance(entry, (list, tuple)) and len(entry) >= 2 and isinstance(entry[1], int):
            out[str(instance_id)] = entry[1]
        else:
            raise LookupFailed("lmcache_bad_reply", f"odd layout entry {entry!r}")
    return out


class LMCacheClient:
    def __init__(self, url: str, timeout_s: float) -> None:
        self.url = url
        self.timeout_s = timeout_s
        self._session: aiohttp.ClientSession | None = None
        parsed = URL(url)
        # the hot-path lookup uses a lean keep-alive client; https (rare for an in-cluster controller)
        # and the background worker-info queries use aiohttp
        self._fast = KeepAliveClient(parsed.host or "127.0.0.1", parsed.port or 80) \
            if parsed.scheme == "http" else None
        self._lookup_path = (parsed.path.rstrip("/") or "") + "/lookup"

    def _ensure(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=64, ttl_dns_cache=300, keepalive_timeout=30),
                timeout=aiohttp.ClientTimeout(total=None),
                json_serialize=json.dumps)
        return self._session

    async def _post(self, path: str, payload: bytes, timeout_s: float) -> Any:
        session = self._ensure()
        async with asyncio.timeout(timeout_s):
            async with session.post(self.url + path, data=payload,
                                    headers={"content-type": "application/json"}) as resp:
                raw = await resp.read()
                if resp.status != 200:
                    raise LookupFailed("lmcache_error", f"HTTP {resp.status}")
        return json.loads(raw)

    async def lookup(self, tokens: Sequence[int]) -> dict[str, int]:
        # A partial trailing 256-token chunk never matches: sending only full chunks saves encoding work.
        full = len(tokens) - len(tokens) % LMCACHE_CHUNK_TOKENS
        if full == 0:
            return {}
        payload = b'{"tokens":' + json.dumps(tokens[:full] if full < len(tokens) else tokens).encode() + b"}"
        try:
            if self._fast is not None:
                async with asyncio.timeout(self.timeout_s):
                    status, raw = await self._fast.post(self._lookup_path, payload)
                if status != 200:
                    raise LookupFailed("lmcache_error", f"HTTP {status}")
                body = json.loads(raw)
            else:
                body = await self._post("/lookup", payload, self.timeout_s)
        except TimeoutError:
            raise LookupFailed("lmcache_timeout") from None
        except LookupFailed:
            raise
        except (aiohttp.ClientError, HttpError, OSError, ValueError) as exc:
            raise LookupFailed("lmcache_error", str(exc)) from None
        return parse_layout(body)

    async def worker_info(self, instance_id: str = "all", timeout_s: float = 2.0) -> list[WorkerRecord]:
        body = await self._post("/query_worker_info", json.dumps({"instance_id": instance_id}).encode(),
                                timeout_s)
        return [WorkerRecord.from_json(w) for w in body.get("worker_infos", [])]

    async def close(self) -> None:
        if self._fast is not None:
            self._fast.close()
        if self._session is not None:
            await self._session.close()
