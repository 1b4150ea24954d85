"""Tell a real LMCache controller what one simulated engine's LMCache CPU store holds, as an LMCache worker.

Wire protocol, read from lmcache 0.5.6 (`lmcache/v1/cache_controller/`):
- RegisterMsg is a worker *request*: DEALER -> the controller's ROUTER `reply` socket, frames [b"", payload];
  the controller answers [b"", msgpack(RegisterRetMsg)]
  (cache_controller/controller_manager.py handle_batched_req_request).
- BatchedKVOperationMsg and DeRegisterMsg are worker *messages*: PUSH -> the controller's PULL `pull` socket,
  one message per frame (cache_controller/controller_manager.py handle_batched_push_request).
- Both sockets accept a frame starting with b"{" as JSON (`msgspec.convert(json.loads(part), type=Msg)`),
  anything else as msgpack. Messages are msgspec tagged unions: the tag field is "type" = the class name.
- seq_num is a per-(worker, location) counter starting at 0 that the controller expects to grow by exactly 1
  per operation (cache_controller/utils.py WorkerNode.handle_batched_kv_operations logs a gap but still
  applies the op).
The controller connects a REQ socket back to the registered ip:port for control messages; we bind a
socket there so that connection lands somewhere quiet instead of retrying against nothing (or, worse,
against the engine's HTTP port).

If the controller is absent, nothing here raises: registration is retried in the background and, once it
succeeds, every held key is re-admitted so the controller's view catches up.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import msgpack
import zmq
import zmq.asyncio

from loadaware.fleet.addresses import tcp_url, url_host

log = logging.getLogger(__name__)

LOCATION = "LocalCPUBackend"


@dataclass(frozen=True, slots=True)
class ControllerAddress:
    host: str
    pull_port: int
    reply_port: int


class LMCacheReporter:
    def __init__(
        self,
        controller: ControllerAddress,
        instance_id: str,
        worker_ip: str,
        worker_port: int,
        current_keys: Callable[[], Sequence[int]] = list,
        ctx: zmq.asyncio.Context | None = None,
        register_timeout_s: float = 2.0,
        retry_interval_s: float = 1.0,
    ) -> None:
        self.controller = controller
        self.instance_id = instance_id
        self.worker_ip = worker_ip
        self.worker_port = worker_port
        self._current_keys = current_keys
        self._ctx = ctx or zmq.asyncio.Context.instance()
        # PUSH is only ever sent with NOBLOCK, so a plain socket does: no futures to check per send.
        self._sync_ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        self._register_timeout_s = register_timeout_s
        self._retry_interval_s = retry_interval_s
        self._push: zmq.Socket[bytes] | None = None
        self._listener: zmq.asyncio.Socket | None = None
        self._register_task: asyncio.Task[None] | None = None
        self.registered = False
        self.seq_num = 0
        self.dropped_ops = 0

    # ---- lifecycle -------------------------------------------------------------------------------------
    async def start(self, wait: bool = True) -> bool:
        """Connect and register; with `wait`, returns whether the first attempt succeeded."""
        c = self.controller
        self._push = self._sync_ctx.socket(zmq.PUSH)
        self._push.setsockopt(zmq.LINGER, 1000)  # long enough to flush DeRegisterMsg on close
        self._push.setsockopt(zmq.SNDHWM, 100_000)
        self._push.setsockopt(zmq.IPV6, 1)  # a controller or worker on an IPv6 address
        self._push.connect(tcp_url(c.host, c.pull_port))
        self._bind_listener()
        if wait and await self._register_once():
            return True
        self._register_task = asyncio.create_task(self._register_loop(), name=f"lmcache-register-{self.instance_id}")
        return False

    def _bind_listener(self) -> None:
        try:
            sock = self._ctx.socket(zmq.ROUTER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.IPV6, 1)
            if self.worker_port == 0:
                self.worker_port = sock.bind_to_random_port(f"tcp://{url_host(self.worker_ip)}")
            else:
                sock.bind(tcp_url(self.worker_ip, self.worker_port))
            self._listener = sock
        except zmq.ZMQError as e:
            log.warning("%s: cannot bind LMCache worker port %s:%s (%s); continuing",
                        self.instance_id, self.worker_ip, self.worker_port, e)

    async def _register_once(self) -> bool:
        dealer = self._ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.setsockopt(zmq.IPV6, 1)
        dealer.connect(tcp_url(self.controller.host, self.controller.reply_port))
        try:
            msg = {"type": "RegisterMsg", "instance_id": self.instance_id, "worker_id": 0,
                   "ip": self.worker_ip, "port": self.worker_port, "peer_init_url": None}
            await dealer.send_multipart([b"", json.dumps(msg).encode()])
            frames = await asyncio.wait_for(dealer.recv_multipart(), self._register_timeout_s)
            reply = msgpack.unpackb(frames[-1], raw=False)
            if not isinstance(reply, dict) or reply.get("type") != "RegisterRetMsg":
                log.warning("%s: unexpected register reply %r", self.instance_id, reply)
                return False
        except (TimeoutError, zmq.ZMQError, ValueError) as e:
            log.warning("%s: LMCache controller registration failed: %r", self.instance_id, e)
            return False
        finally:
            dealer.close()  # a late reply to a timed-out attempt must not be read by the next one
        self.registered = True
        # Re-registering clears the worker's keys on the controller; a first registration has none.
        # Either way, replay what we hold so the controller's view is complete.
        keys = list(self._current_keys())
        if keys:
            self._send_ops([("admit", k) for k in keys])
        log.info("%s: registered with LMCache controller (%d keys replayed)", self.instance_id, len(keys))
        return True

    async def _register_loop(self) -> None:
        while not self.registered:
            await asyncio.sleep(self._retry_interval_s)
            await self._register_once()

    async def stop(self) -> None:
        if self._register_task is not None:
            self._register_task.cancel()
            try:
                await self._register_task
            except asyncio.CancelledError:
                pass
        if self.registered and self._push is not None:
            self._send({"type": "DeRegisterMsg", "instance_id": self.instance_id, "worker_id": 0,
                        "ip": self.worker_ip, "port": self.worker_port})
            self.registered = False
        if self._push is not None:
            self._push.close()  # LINGER lets the DeRegisterMsg go out
            self._push = None
        if self._listener is not None:
            self._listener.close()
            self._listener = None

    # ---- operations ------------------------------------------------------------------------------------
    def admit(self, keys: Sequence[int]) -> None:
        self._send_ops([("admit", k) for k in keys])

    def evict(self, keys: Sequence[int]) -> None:
        self._send_ops([("evict", k) for k in keys])

    def report(self, admitted: Sequence[int], evicted: Sequence[int]) -> None:
        """One batch: evictions first (they free the space the admissions use, as in LMCache)."""
        self._send_ops([("evict", k) for k in evicted] + [("admit", k) for k in admitted])

    def _send_ops(self, ops: list[tuple[str, int]]) -> None:
        if not ops:
            return
        if not self.registered:
            # The controller would reject ops from an unregistered worker; the replay at registration covers them.
            self.dropped_ops += len(ops)
            return
        operations = []
        for op_type, key in ops:
            operations.append({"op_type": op_type, "key": key, "seq_num": self.seq_num})
            self.seq_num += 1
        self._send({"type": "BatchedKVOperationMsg", "instance_id": self.instance_id, "worker_id": 0,
                    "location": LOCATION, "operations": operations})

    def _send(self, msg: dict[str, Any]) -> None:
        if self._push is None:
            return
        try:
            # NOBLOCK: a missing controller must never stall the engine; ZMQ queues up to SNDHWM.
            self._push.send(json.dumps(msg).encode(), flags=zmq.NOBLOCK)
        except zmq.ZMQError as e:
            self.dropped_ops += len(msg.get("operations", ()))
            log.warning("%s: dropped LMCache message %s: %r", self.instance_id, msg["type"], e)
