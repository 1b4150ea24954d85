"""Engines that cost the machine almost nothing, for benchmarks whose figure is the gateway's own.

    python -m bench.null_engine --listen 127.0.0.1:PORT [--listen ...]

Each address serves POST /v1/completions and /v1/chat/completions by reading the body (not parsing it) and
answering, at once, one SSE event and `data: [DONE]` (the benchmark's clients always stream); GET /metrics with
the vLLM gauges the sidecar scrapes (all 0), GET /v1/models and /health. No tokenizer, no JSON parse, no
scheduler: what a long prompt costs between the client and this server is the gateway's.
"""

from __future__ import annotations

import argparse
import asyncio
import signal

from aiohttp import web

EVENT = (b'data: {"id":"cmpl-0","object":"text_completion","model":"tiny-model",'
         b'"choices":[{"index":0,"text":" ok","finish_reason":"length"}]}\n\n')
DONE = b"data: [DONE]\n\n"
METRICS = (b"# TYPE vllm:num_requests_running gauge\n"
           b'vllm:num_requests_running{model_name="tiny-model"} 0\n'
           b"# TYPE vllm:num_requests_waiting gauge\n"
           b'vllm:num_requests_waiting{model_name="tiny-model"} 0\n'
           b"# TYPE vllm:kv_cache_usage_perc gauge\n"
           b'vllm:kv_cache_usage_perc{model_name="tiny-model"} 0\n')
MODELS = b'{"object":"list","data":[{"id":"tiny-model","object":"model","max_model_len":1048576}]}'


async def complete(request: web.Request) -> web.StreamResponse:
    await request.read()  # the whole body, as an engine must before it can start
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    await response.write(EVENT)
    await response.write(DONE)
    await response.write_eof()
    return response


async def metrics(_: web.Request) -> web.Response:
    return web.Response(body=METRICS, content_type="text/plain")


async def models(_: web.Request) -> web.Response:
    return web.Response(body=MODELS, content_type="application/json")


async def health(_: web.Request) -> web.Response:
    return web.Response(text="ok")


def app() -> web.Application:
    a = web.Application(client_max_size=64 * 1024 * 1024)
    a.router.add_post("/v1/completions", complete)
    a.router.add_post("/v1/chat/completions", complete)
    a.router.add_get("/metrics", metrics)
    a.router.add_get("/v1/models", models)
    a.router.add_get("/health", health)
    return a


async def serve(addresses: list[str]) -> None:
    runners = []
    for address in addresses:
        host, _, port = address.rpartition(":")
        runner = web.AppRunner(app(), access_log=None)
        await runner.setup()
        await web.TCPSite(runner, host, int(port)).start()
        runners.append(runner)
    print("READY " + ",".join(addresses), flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    for runner in runners:
        await runner.cleanup()


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.null_engine", description=__doc__.splitlines()[0])
    p.add_argument("--listen", action="append", required=True, help="HOST:PORT (repeat for more engines)")
    asyncio.run(serve(p.parse_args().listen))


if __name__ == "__main__":
    main()
