"""`make demo`: `python -m demo [--log-dir out/demo/logs] [--beta 1.0] [--no-experiment]`.

Starts the stack, walks through the storyline (see the package docstring), stops the stack, then runs the
short experiment; prints a `summary:` line and ends with `DEMO OK` (exit 0) or `DEMO FAILED` (exit 1).
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

from demo.real_vllm import run_real_vllm_step
from demo.session import DemoSession
from demo.short_experiment import run_short_experiment
from demo.startup import start_stack
from demo.walkthrough import walk_through
from testkit.lmcache import LMCacheControllerProc
from testkit.paths import REPO
from testkit.ports import free_port
from testkit.procs import ProcError
from testkit.stack import Stack

DEFAULT_LOG_DIR = REPO / "out" / "demo" / "logs"


def _raise_on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m demo", description="loadaware routing demo")
    parser.add_argument("--log-dir", type=Path, default=DEFAULT_LOG_DIR)
    parser.add_argument("--beta", type=float, default=1.0,
                        help="loadaware's beta, where the default policy resolves to loadaware (no tokenizer)")
    parser.add_argument("--no-experiment", action="store_true",
                        help="skip the closing short experiment (2 seeds x 3 arms, ~4 min)")
    parser.add_argument("--no-vllm", action="store_true",
                        help="skip the real-vLLM step (it runs when .vllm-venv exists: 2 engines, a few minutes)")
    parser.add_argument("--experiment-point", choices=("reference", "tiny"), default="reference",
                        help="the short experiment's operating point (tiny: seconds, for tests)")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _raise_on_sigterm)  # stop the stack on SIGTERM as on Ctrl-C
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even when started in the background
    if not LMCacheControllerProc.available():
        print("DEMO FAILED: the LMCache controller is not installed; run `make lmcache` first", flush=True)
        return 2
    metrics_port = free_port()
    metrics_url = f"http://127.0.0.1:{metrics_port}"
    sidecar_args = ["--metrics-listen", f"127.0.0.1:{metrics_port}", "--scrape-interval-s", "0.25",
                    "--loadaware-beta", str(args.beta), "--log-level", "WARNING"]  # the default --policy
    t0 = time.monotonic()
    print(f"starting LMCache controller + 3 simulated engines + sidecar + Envoy (logs: {args.log_dir}) ...",
          flush=True)
    demo: DemoSession | None = None
    stack: Stack | None = None
    try:
        stack = start_stack(args.log_dir, sidecar_args)
        demo = asyncio.run(walk_through(stack, metrics_url, args.beta))
        print("\nstopping the stack ...", flush=True)
    except KeyboardInterrupt:
        print("\ninterrupted: stopping the stack", flush=True)
        return 130
    except ProcError as e:
        print(f"\nDEMO FAILED: the stack did not start:\n{e}", flush=True)
        return 1
    finally:
        if stack is not None:
            stack.stop()
    assert demo is not None  # every other way out of the block above returned
    real_vllm = "skipped"
    if not args.no_vllm and not demo.failures:
        try:
            real_vllm = run_real_vllm_step(args.log_dir / "vllm", args.beta, demo.check)
        except KeyboardInterrupt:
            print("\ninterrupted: the real-vLLM step stopped its engines", flush=True)
            return 130
        except (ProcError, OSError) as e:
            demo.check(False, f"the real-vLLM step did not run: {e}")
    experiment = "skipped"
    if not args.no_experiment and not demo.failures:
        try:
            experiment = run_short_experiment(args.log_dir / "experiment", args.experiment_point)
        except KeyboardInterrupt:
            print("\ninterrupted: the experiment stopped its processes", flush=True)
            return 130
        except (ProcError, OSError, RuntimeError) as e:
            demo.check(False, f"the short experiment did not run: {e}")
    elapsed = time.monotonic() - t0
    f = demo.facts
    print(f"\nsummary: step1={f.get('step1')} step2={f.get('step2')} step3={f.get('step3')} "
          f"step4={f.get('step4')} step5={f.get('step5')} burst={f.get('burst')} "
          f"fallbacks={f.get('fallbacks')} inflight={f.get('inflight')} picker={f.get('picker')} "
          f"retry={f.get('retry')} models={f.get('models')} failover={f.get('failover')} "
          f"agentic={f.get('agentic')} messages={f.get('messages')} "
          f"vllm={real_vllm} experiment={experiment} "
          f"elapsed={elapsed:.1f}s", flush=True)
    if demo.failures:
        print(f"DEMO FAILED: {len(demo.failures)} check(s) failed: " + "; ".join(demo.failures), flush=True)
        return 1
    print("DEMO OK", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
