"""Bring the demo's stack up on the shipped fixed addresses, queueing behind other runs on this machine."""

from __future__ import annotations

import time
from pathlib import Path

from demo.picker import PICKER_ADMIN_PORT, PICKER_LISTEN_PORT
from testkit.loopback_lock import loopback_lock
from testkit.ports import ENVOY_ADMIN_PORT, ENVOY_LISTEN_PORT, SIDECAR_PORT, wait_addresses_free
from testkit.procs import ProcError
from testkit.retry import start_with_retries
from testkit.stack import Stack

# Step 7's second Envoy (envoy/envoy-inference-pool.yaml) binds its listener and admin ports beside these.
FIXED_ADDRESSES = (("127.0.0.1", ENVOY_LISTEN_PORT), ("127.0.0.1", ENVOY_ADMIN_PORT), ("127.0.0.1", SIDECAR_PORT),
                   ("127.0.0.1", PICKER_LISTEN_PORT), ("127.0.0.1", PICKER_ADMIN_PORT),
                   ("127.0.0.2", 8000), ("127.0.0.3", 8000), ("127.0.0.4", 8000))


def start_stack(log_dir: Path, sidecar_args: list[str], attempts: int = 4, wait_s: float = 120.0) -> Stack:
    """Start the stack once the fixed addresses are free; retry when another run grabbed one meanwhile.

    A readiness probe that answers does not prove that *our* process answered (a foreign sidecar on :9002
    passes the health check), so after the start every process must still be alive."""

    def attempt() -> Stack:
        t_wait = time.monotonic()
        # Runs that use testkit queue on its cross-process lock; others are seen by their listening ports.
        with loopback_lock(timeout=600.0):
            wait_addresses_free(FIXED_ADDRESSES, wait_s)
            waited = time.monotonic() - t_wait
            if waited > 0.5:
                print(f"   waited {waited:.1f}s for another run on this machine to free the shared ports",
                      flush=True)
            stack = Stack(log_dir, engines=3, lmcache=True, sidecar_args=sidecar_args)
            t0 = time.monotonic()
            try:
                stack.start()  # takes the (reentrant) lock too and keeps it until stack.stop()
                time.sleep(0.3)
                dead = [p for p in stack.procs() if not p.running]
                if dead:
                    raise ProcError("exited right after start: " + ", ".join(p.name for p in dead) + "\n"
                                    + "\n".join(p.log_tail(8) for p in dead))
            except BaseException:
                stack.stop()
                raise
        print(f"stack up in {time.monotonic() - t0:.1f}s", flush=True)
        return stack

    def report_retry(n: int, _: ProcError) -> None:
        print(f"   start attempt {n} lost a port to another run; retrying ...", flush=True)

    try:
        return start_with_retries(attempt, attempts=attempts, what="the stack", delay_s=2.0,
                                  retry_if=lambda e: "in use" in str(e), on_retry=report_retry)
    except TimeoutError as e:  # the fixed addresses stayed busy: waiting longer will not help
        raise ProcError(str(e)) from None
