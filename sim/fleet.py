"""A fleet of simulated engines in one process and one event loop, as a CLI and a Python API.

    python -m sim.fleet --engines 3 --base-ip 127.0.0.2 --port 8000 --tokenizer sim/assets/tiny-model \\
        [--lmcache-host 127.0.0.1 --lmcache-pull-port A --lmcache-reply-port B] [--names a,b,c] [model flags]
        [--kv-events [--kv-events-port 5557 --kv-events-replay-port 5558 --kv-events-hash int|bytes]]
        [--models 'model-a;model-a;model-b,b-alias+b-adapter=/loras/b']  (per engine; see sim/models.py)
        [--no-responses-store]  (the Responses API store; default: env VLLM_ENABLE_RESPONSES_API_STORE, else on)

Engine i is named `engine-<i>` (or the i-th of --names; the name is also its LMCache instance id) and
listens on base-ip + i (every 127/8 address is bindable on Linux), all on the same port; with an IPv6
base-ip (`::1`, the only IPv6 loopback address) all on base-ip, on port + i (port 0: free ports). Once every engine
listens and has tried to register with LMCache, exactly one line goes to stdout:

    READY [{"name": "engine-0", "url": "http://127.0.0.2:8000", "ip": "127.0.0.2", "port": 8000, ...}, ...]

With --kv-events each engine also publishes its prefix cache as vLLM KV events (sim/kv_events_publisher.py)
on <its ip>:5557, replay on :5558, alongside its LMCache reporting: one fleet drives either prefix source.

SIGTERM / SIGINT deregister from LMCache, close the listeners and exit 0.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import json
import logging
import signal
import sys
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sim.engine import Engine, EngineConfig
from sim.kv_events_publisher import KvEventsPublisher
from sim.lmcache_reporter import ControllerAddress
from sim.models import EngineModels, parse_fleet_models
from sim.service_model import ServiceModel, add_cli_flags, from_cli_args
from sim.tokenization import SimTokenizer

log = logging.getLogger(__name__)

DEFAULT_TOKENIZER = Path(__file__).parent / "assets" / "tiny-model"


@dataclass(frozen=True)
class KvEventsOptions:
    """Publish vLLM KV events from every engine on <engine ip>:port, replay ROUTER on <engine ip>:replay_port."""

    port: int = 5557
    replay_port: int | None = 5558
    topic: str = ""
    hash_format: str = "int"  # "bytes" as newer vLLM versions send


@dataclass
class Fleet:
    engines: list[Engine] = field(default_factory=list)
    kv_events: dict[str, KvEventsPublisher] = field(default_factory=dict)  # engine name -> its publisher

    def describe(self) -> list[dict[str, Any]]:
        out = []
        for e in self.engines:
            d = e.describe()
            if e.name in self.kv_events:
                d.update(self.kv_events[e.name].describe())
            out.append(d)
        return out

    def by_name(self, name: str) -> Engine:
        for e in self.engines:
            if e.name == name:
                return e
        raise KeyError(name)

    async def stop(self) -> None:
        for publisher in self.kv_events.values():
            await publisher.stop()
        # Deregister and close every engine even if one of them fails to.
        results = await asyncio.gather(*(e.stop() for e in self.engines), return_exceptions=True)
        for engine, result in zip(self.engines, results):
            if isinstance(result, BaseException):
                log.warning("stopping %s failed: %r", engine.name, result)


def engine_ips(base_ip: str, n: int) -> list[str]:
    base = ipaddress.ip_address(base_ip)
    return [str(base + i) for i in range(n)]


def engine_addresses(base_ip: str, port: int, n: int) -> list[tuple[str, int]]:
    """(ip, port) of each engine: base-ip + i on one port; on IPv6, whose loopback is the one address ::1,
    every engine on base-ip, on port + i (port 0: each its own free port)."""
    if ipaddress.ip_address(base_ip).version == 6:
        return [(base_ip, port + i if port else 0) for i in range(n)]
    return [(ip, port) for ip in engine_ips(base_ip, n)]


async def start_fleet(
    engines: int,
    base_ip: str = "127.0.0.2",
    port: int = 8000,
    tokenizer: str | Path | SimTokenizer = DEFAULT_TOKENIZER,
    lmcache: ControllerAddress | None = None,
    service: ServiceModel | None = None,
    names: Sequence[str] | None = None,
    model_id: str = "tiny-model",
    kv_events: KvEventsOptions | None = None,
    models: Sequence[EngineModels] | None = None,
    responses_store: bool | None = None,
) -> Fleet:
    """Start `engines` engines (port 0: each picks a free port) and register them with LMCache if given.
    `models`: what each engine serves (its base name replaces `model_id`). `responses_store`: the Responses
    API store (None: env VLLM_ENABLE_RESPONSES_API_STORE when set, else on)."""
    if names is not None and len(names) != engines:
        raise ValueError(f"{len(names)} names for {engines} engines")
    if models is not None and len(models) != engines:
        raise ValueError(f"{len(models)} model specs for {engines} engines")
    tok = tokenizer if isinstance(tokenizer, SimTokenizer) else SimTokenizer(tokenizer)
    service = service or ServiceModel()
    fleet = Fleet([
        Engine(EngineConfig(name=names[i] if names is not None else f"engine-{i}", ip=ip, port=engine_port,
                            model_id=models[i].base if models else model_id,
                            models=models[i] if models else None, service=service, lmcache=lmcache,
                            responses_store=responses_store), tok)
        for i, (ip, engine_port) in enumerate(engine_addresses(base_ip, port, engines))
    ])
    # Concurrently: with the controller absent each registration attempt waits out its timeout.
    results = await asyncio.gather(*(e.start() for e in fleet.engines), return_exceptions=True)
    failures = [r for r in results if isinstance(r, BaseException)]
    if failures:
        await fleet.stop()
        raise failures[0]
    if kv_events is not None:
        try:
            for engine in fleet.engines:
                publisher = KvEventsPublisher(engine.ip, kv_events.port, kv_events.replay_port,
                                              service.block_size, kv_events.topic, hash_format=kv_events.hash_format)
                publisher.start()
                fleet.kv_events[engine.name] = publisher
                engine.core.prefix_cache.add_observer(publisher)
                engine.kv_drop = publisher.drop_next
        except BaseException:
            await fleet.stop()
            raise
    return fleet


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m sim.fleet", description="Simulated vLLM(+LMCache) engines")
    p.add_argument("--engines", type=int, default=2)
    p.add_argument("--base-ip", default="127.0.0.2")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--tokenizer", default=str(DEFAULT_TOKENIZER))
    p.add_argument("--model-id", default="tiny-model")
    p.add_argument("--models", default=None,
                   help="per engine, ';'-separated: name[,alias...][+adapter[=path]...] (one spec: every engine)")
    p.add_argument("--names", default=None, help="comma-separated engine names (default engine-<i>)")
    p.add_argument("--lmcache-host", default=None)
    p.add_argument("--lmcache-pull-port", type=int, default=None)
    p.add_argument("--lmcache-reply-port", type=int, default=None)
    p.add_argument("--kv-events", action="store_true", help="publish vLLM KV events from every engine")
    p.add_argument("--kv-events-port", type=int, default=5557, help="PUB port on each engine's ip (0: random)")
    p.add_argument("--kv-events-replay-port", type=int, default=5558,
                   help="replay ROUTER port on each engine's ip (0: random, -1: none)")
    p.add_argument("--kv-events-topic", default="")
    p.add_argument("--kv-events-hash", choices=("int", "bytes"), default="int",
                   help="block hash encoding (newer vLLM versions send bytes)")
    p.add_argument("--responses-store", action=argparse.BooleanOptionalAction, default=None,
                   help="store Responses API responses for previous_response_id (default: env "
                        "VLLM_ENABLE_RESPONSES_API_STORE when set, else on)")
    p.add_argument("--log-level", default="WARNING")
    add_cli_flags(p)
    return p


async def _amain(args: argparse.Namespace) -> int:
    lmcache = None
    if args.lmcache_pull_port is not None or args.lmcache_reply_port is not None:
        if args.lmcache_pull_port is None or args.lmcache_reply_port is None:
            raise SystemExit("--lmcache-pull-port and --lmcache-reply-port go together")
        lmcache = ControllerAddress(args.lmcache_host or "127.0.0.1", args.lmcache_pull_port,
                                    args.lmcache_reply_port)
    names = [n.strip() for n in args.names.split(",")] if args.names else None
    try:
        models = parse_fleet_models(args.models, args.engines) if args.models else None
    except ValueError as exc:
        raise SystemExit(f"--models: {exc}") from None
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    kv_events = KvEventsOptions(args.kv_events_port,
                                None if args.kv_events_replay_port < 0 else args.kv_events_replay_port,
                                args.kv_events_topic, args.kv_events_hash) if args.kv_events else None
    fleet = await start_fleet(args.engines, args.base_ip, args.port, args.tokenizer, lmcache,
                              from_cli_args(args), names, args.model_id, kv_events, models, args.responses_store)
    sys.stdout.write("READY " + json.dumps(fleet.describe()) + "\n")
    sys.stdout.flush()
    await stop.wait()
    await fleet.stop()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        import uvloop

        runner: Callable[[Coroutine[Any, Any, int]], int] = uvloop.run
    except ImportError:  # pragma: no cover - uvloop is optional
        runner = asyncio.run
    return runner(_amain(args))


if __name__ == "__main__":
    sys.exit(main())
