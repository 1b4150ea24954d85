"""The demo against a running stack: one HTTP session, the storyline, the burst, the picker mode, a failing
engine, agentic traffic."""

from __future__ import annotations

import aiohttp

from demo.agentic import agentic
from demo.burst import burst
from demo.failover import failing_engine
from demo.models import two_models
from demo.picker import picker_mode
from demo.session import DemoFailure, DemoSession, debug_url_of
from demo.storyline import storyline
from sim.tokenization import SimTokenizer
from testkit.paths import TINY_TOKENIZER
from testkit.stack import Stack


async def walk_through(stack: Stack, metrics_url: str, beta: float) -> DemoSession:
    """Once the sidecar says ready: steps 1-5, the burst, the picker mode (step 7), two models (step 8), a
    failing engine (step 9), agentic traffic (step 10). A failure ends the walk and is recorded as a failed
    check; the session (checks, facts) is returned either way."""
    assert stack.fleet is not None
    names = {f"{e['ip']}:{e['port']}": str(e["name"]) for e in stack.fleet.engines}
    urls = {str(e["name"]): str(e["url"]) for e in stack.fleet.engines}
    tok = SimTokenizer(TINY_TOKENIZER)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=64)) as session:
        debug_url = debug_url_of(stack.sidecar, metrics_url)
        demo = DemoSession(stack, session, tok, beta, names, urls, metrics_url, debug_url)

        async def sidecar_ready() -> bool:
            return bool((await demo.get_json(f"{debug_url}/debug/state")).get("ready"))

        try:
            if await demo.wait_for(f"the sidecar's {debug_url}/debug/state says ready", sidecar_ready, 15.0):
                await storyline(demo)
                await burst(demo)
                await picker_mode(demo)
                await two_models(demo)
                await failing_engine(demo)
                await agentic(demo)
        except DemoFailure as e:
            demo.check(False, str(e))
        except (TimeoutError, aiohttp.ClientError, OSError, KeyError, ValueError) as e:
            demo.check(False, f"unexpected {type(e).__name__}: {e}")
        return demo
