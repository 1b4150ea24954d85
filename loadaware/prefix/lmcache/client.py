"""LMCache controller over HTTP: prefix lookups (hot path, time-boxed) and the instance-id bridge's
refresh (background, concurrent, never per request)."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Sequence
from typing import Any

import aiohttp
from yarl import URL

from loadaware.prefix.lmcache.bridge import InstanceBridge, WorkerRecord
from loadaware.prefix.lmcache.http1 import HttpError, KeepAliveClient
from loadaware.prefix.source import PrefixUnavailable
from loadaware.telemetry.metrics import Metrics

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


class InstanceResolver:
    """Keeps an InstanceBridge fresh: a periodic full refresh, plus prompt targeted refreshes when a
    decision met an unknown holder or the fleet has unmapped endpoints. Requests never wait on it."""

    def __init__(self, client: LMCacheClient, bridge: InstanceBridge, period_s: float,
                 min_gap_s: float = 2.0) -> None:
        self.client = client
        self.bridge = bridge
        self.period_s = period_s
        self.min_gap_s = min_gap_s
        self._wake = asyncio.Event()
        self._pending_ids: set[str] = set()
        self._asked: dict[str, float] = {}
        self._last_full = 0.0
        self._full_wanted = True
        self.refreshes = 0
        self.attempts = 0  # readiness waits for the first attempt, successful or not (fail open)

    def report_unknown(self, instance_ids: Sequence[str]) -> None:
        now = time.monotonic()
        for instance_id in instance_ids:
            if now - self._asked.get(instance_id, 0.0) >= self.min_gap_s:
                self._pending_ids.add(instance_id)
                self._wake.set()

    def request_full(self) -> None:
        if time.monotonic() - self._last_full >= self.min_gap_s:
            self._full_wanted = True
            self._wake.set()

    async def refresh_full(self) -> None:
        self._last_full = time.monotonic()
        workers = await self.client.worker_info("all")
        self.bridge.apply_workers(workers, complete=True)
        self.refreshes += 1

    async def refresh_ids(self, instance_ids: Sequence[str]) -> None:
        now = time.monotonic()
        for instance_id in instance_ids:
            self._asked[instance_id] = now
        # "all" is served from a 30 s cache: ask by name to see fresh registrations
        answers = await asyncio.gather(*(self.client.worker_info(i) for i in instance_ids),
                                       return_exceptions=True)
        workers: list[WorkerRecord] = []
        answered: list[str] = []
        for instance_id, answer in zip(instance_ids, answers):
            if isinstance(answer, BaseException):
                continue
            workers.extend(answer)
            answered.append(instance_id)
        self.bridge.apply_workers(workers, complete=False, queried_ids=answered)
        self.refreshes += 1

    async def run(self) -> None:
        self._full_wanted = True
        while True:
            self._wake.clear()
            try:
                pending = sorted(self._pending_ids)
                self._pending_ids.clear()
                if pending:
                    await self.refresh_ids(pending)
                if self._full_wanted or time.monotonic() - self._last_full >= self.period_s:
                    self._full_wanted = False
                    await self.refresh_full()
            except Exception as exc:  # noqa: BLE001 - the controller being away only delays the bridge
                log.warning("LMCache worker-info refresh failed: %s", exc)
            self.attempts += 1
            if self._pending_ids or self._full_wanted:
                await asyncio.sleep(self.min_gap_s / 4)  # a burst of unknowns is batched, not looped on
                continue
            try:
                await asyncio.wait_for(self._wake.wait(), self.period_s)
            except TimeoutError:
                pass


class LMCachePrefixSource:
    """Prefix matches from the LMCache controller, credited to live endpoints through the instance bridge."""

    name = "lmcache"

    def __init__(self, client: LMCacheClient, bridge: InstanceBridge, resolver: InstanceResolver | None,
                 metrics: Metrics) -> None:
        self.client = client
        self.bridge = bridge
        self.resolver = resolver
        self.metrics = metrics

    async def matches(self, tokens: Sequence[int], endpoints: tuple[str, ...]) -> dict[str, int]:
        try:
            layout = await self.client.lookup(tokens)
        except PrefixUnavailable:
            self.metrics.lookup_result("failed")
            raise
        credit = self.bridge.credit(layout, endpoints)
        if credit.unknown_ids:
            self.metrics.unmapped_holders.labels("unknown").inc(len(credit.unknown_ids))
            if self.resolver is not None:
                self.resolver.report_unknown(credit.unknown_ids)
        if credit.ignored_ids:
            self.metrics.unmapped_holders.labels("dead_or_outside").inc(len(credit.ignored_ids))
        self.metrics.lookup_result("match" if credit.matches else "empty")
        return credit.matches
