"""A small keep-alive HTTP/1.1 client for the hot path (LMCache lookups).

aiohttp costs ~250 µs of CPU per small POST here; a protocol-level client on a reused connection costs a
fraction of that. Only what the lookup needs: POST with a body, responses with Content-Length or chunked
encoding, keep-alive with one retry when a pooled connection turns out to be closed.
"""

from __future__ import annotations

import asyncio

from loadaware.fleet.addresses import format_hostport


class HttpError(Exception):
    pass


class _Connection(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.waiter: asyncio.Future[tuple[int, bytes]] | None = None
        self.closed = False
        self.keep_alive = True

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(HttpError(f"connection lost: {exc or 'closed by peer'}"))

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if self.waiter is None or self.waiter.done():
            return
        try:
            parsed = self._parse()
        except HttpError as exc:
            self.waiter.set_exception(exc)
            return
        if parsed is not None:
            self.waiter.set_result(parsed)

    def _parse(self) -> tuple[int, bytes] | None:
        head_end = self.buf.find(b"\r\n\r\n")
        if head_end < 0:
            return None
        head = bytes(self.buf[:head_end]).decode("latin-1").split("\r\n")
        try:
            status = int(head[0].split(" ", 2)[1])
        except (IndexError, ValueError):
            raise HttpError(f"bad status line {head[0]!r}") from None
        headers = {}
        for line in head[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip().lower()
        body_start = head_end + 4
        if headers.get("connection") == "close":
            self.keep_alive = False
        if "chunked" in headers.get("transfer-encoding", ""):
            body = self._parse_chunked(body_start)
            if body is None:
                return None
            return status, body
        length = int(headers.get("content-length", "0"))
        if len(self.buf) - body_start < length:
            return None
        body = bytes(self.buf[body_start:body_start + length])
        del self.buf[:body_start + length]
        return status, body

    def _parse_chunked(self, pos: int) -> bytes | None:
        out = bytearray()
        while True:
            line_end = self.buf.find(b"\r\n", pos)
            if line_end < 0:
                return None
            try:
                size = int(bytes(self.buf[pos:line_end]).split(b";")[0], 16)
            except ValueError:
                raise HttpError("bad chunk size") from None
            if size == 0:
                end = self.buf.find(b"\r\n\r\n", line_end)  # optional trailers, then the blank line
                if end < 0:
                    return None
                del self.buf[:end + 4]
                return bytes(out)
            start = line_end + 2
            if len(self.buf) < start + size + 2:
                return None
            out += self.buf[start:start + size]
            pos = start + size + 2


class KeepAliveClient:
    def __init__(self, host: str, port: int, max_idle: int = 16) -> None:
        self.host = host
        self.port = port
        self.max_idle = max_idle
        self._idle: list[_Connection] = []
        self._host_header = format_hostport(host, port).encode()  # IPv6 bracketed, as HTTP wants

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        _, conn = await loop.create_connection(_Connection, self.host, self.port)
        return conn

    async def post(self, path: str, body: bytes, content_type: bytes = b"application/json") -> tuple[int, bytes]:
        """One POST; the caller time-boxes it (a cancelled request's connection is discarded)."""
        request = (b"POST " + path.encode() + b" HTTP/1.1\r\nHost: " + self._host_header +
                   b"\r\nContent-Type: " + content_type + b"\r\nContent-Length: " + str(len(body)).encode() +
                   b"\r\n\r\n" + body)
        for attempt in (0, 1):
            # Drop every pooled connection the server has closed while idle (uvicorn, e.g. the LMCache
            # controller, closes them after 5 s): after a lull ALL of them are stale, and trying them one by
            # one would exhaust the two attempts and fail the lookup.
            while self._idle and self._idle[-1].closed:
                self._idle.pop().transport.close()  # type: ignore[union-attr]
            reused = bool(self._idle) and attempt == 0  # a retry always gets a fresh connection
            conn = self._idle.pop() if reused else await self._connect()
            if conn.closed:
                continue
            conn.buf.clear()
            conn.waiter = asyncio.get_running_loop().create_future()
            assert conn.transport is not None
            conn.transport.write(request)
            try:
                result = await conn.waiter
            except HttpError:
                conn.transport.close()
                if reused and attempt == 0:
                    continue  # the server closed an idle keep-alive connection: once more on a fresh one
                raise
            except BaseException:
                conn.transport.close()  # cancelled or timed out mid-response: the connection is unusable
                raise
            conn.waiter = None
            if conn.keep_alive and not conn.closed and len(self._idle) < self.max_idle:
                self._idle.append(conn)
            else:
                conn.transport.close()
            return result
        raise HttpError("no usable connection")

    def close(self) -> None:
        for conn in self._idle:
            if conn.transport is not None:
                conn.transport.close()
        self._idle.clear()
