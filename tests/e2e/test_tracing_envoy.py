"""Traces through the real Envoy (envoy/envoy.yaml, BUFFERED): the engine receives a traceparent naming the
sidecar's span (Envoy applied the header the routing reply added), and the span, exported to an OTLP/HTTP JSON
receiver run by the test on 127.0.0.1, is the client's span's child in the client's trace."""

from __future__ import annotations

import json
import threading
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest

from loadaware.telemetry.tracing import parse_traceparent
from testkit.stack import Stack
from tests.conftest import wait_until

pytestmark = pytest.mark.e2e

TRACE = "0af7651916cd43dd8448eb211c80319c"
PARENT = "b7ad6b7169203331"


class Receiver(BaseHTTPRequestHandler):
    spans: ClassVar[list[dict[str, Any]]] = []

    def do_POST(self) -> None:
        assert self.path == "/v1/traces" and self.headers["Content-Type"] == "application/json"
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        for rs in body["resourceSpans"]:
            for ss in rs["scopeSpans"]:
                Receiver.spans.extend(ss["spans"])
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def receiver() -> Iterator[str]:
    Receiver.spans = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_engine_gets_the_sidecars_span_as_parent(tmp_path: Path, receiver: str) -> None:
    with Stack(tmp_path, engines=2, lmcache=False, sidecar_args=["--otlp-endpoint", receiver]) as stack:
        request = urllib.request.Request(
            f"{stack.url}/v1/completions", method="POST",
            data=json.dumps({"model": "tiny-model", "prompt": "hello there", "max_tokens": 2}).encode(),
            headers={"Content-Type": "application/json", "traceparent": f"00-{TRACE}-{PARENT}-01"})
        with urllib.request.urlopen(request, timeout=10) as reply:
            assert reply.status == 200
            upstream = reply.headers["x-sim-traceparent"]
        own = parse_traceparent(upstream or "")
        assert own is not None and own.trace_id == int(TRACE, 16) and own.span_id != int(PARENT, 16), upstream
        span = wait_until(lambda: next((s for s in Receiver.spans if s["spanId"] == f"{own.span_id:016x}"), None),
                          message=lambda: f"the sidecar's span exported; received {Receiver.spans}")
        assert span["traceId"] == TRACE and span["parentSpanId"] == PARENT and span["name"] == "loadaware.route"
        assert len(Receiver.spans) == 1
