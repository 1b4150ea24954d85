"""The real-vLLM tier's engine start (testkit/vllm.py): a port picked free and taken by another process before vLLM
bound it makes the start try again on new ports, unless the engine has served already (others know its ports)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from testkit import vllm
from testkit.procs import ManagedProc, ProcError


class FakeStarts:
    """Stands in for the process start: records each try's argv; the tries listed in `lose` fail as vLLM does
    when a port it binds is taken."""

    def __init__(self, lose: set[int]) -> None:
        self.lose = lose
        self.argvs: list[list[str]] = []

    def __call__(self, proc: ManagedProc, timeout: float | None = None) -> ManagedProc:
        self.argvs.append(list(proc.argv))
        if len(self.argvs) - 1 in self.lose:
            proc.log_dir.mkdir(parents=True, exist_ok=True)
            proc.log_path.write_text("zmq.error.ZMQError: Address already in use (addr='tcp://127.0.0.1:1')\n")
            raise ProcError(f"{proc.name} exited (rc=1) before becoming ready")
        return proc


def arg(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def kv_ports(argv: list[str]) -> tuple[str, str]:
    config: dict[str, Any] = json.loads(arg(argv, "--kv-events-config"))
    return config["endpoint"], config["replay_endpoint"]


@pytest.fixture
def starts(monkeypatch: pytest.MonkeyPatch) -> FakeStarts:
    fake = FakeStarts(lose={0, 2})
    monkeypatch.setattr(vllm, "available", lambda: True)
    monkeypatch.setattr(ManagedProc, "start", lambda proc, timeout=None: fake(proc, timeout))  # bound as a method
    return fake


def test_a_first_start_that_lost_a_port_tries_new_ones_and_a_restart_keeps_them(starts: FakeStarts,
                                                                                 tmp_path: Path) -> None:
    engine = vllm.VllmEngine(tmp_path, name="vllm-a", kv_events=vllm.KvEvents.bound())
    engine.start()
    first, second = starts.argvs
    assert arg(second, "--port") != arg(first, "--port")
    (pub1, replay1), (pub2, replay2) = kv_ports(first), kv_ports(second)
    assert pub1.startswith("tcp://::ffff:127.0.0.1:") and pub2.startswith("tcp://::ffff:127.0.0.1:")
    assert pub2 != pub1 and replay2 != replay1
    assert engine.endpoint == f"127.0.0.1:{arg(second, '--port')}"
    assert engine.kv_pub == f"127.0.0.1:{pub2.rpartition(':')[2]}/{replay2.rpartition(':')[2]}"

    engine.restart()  # loses its port once more (try 2): the sidecar knows these ports now, so they stay
    assert starts.argvs[2] == starts.argvs[3] == second


def test_what_the_engine_was_told_stays_a_port_given_and_the_sidecar_it_connects_to(starts: FakeStarts,
                                                                                    tmp_path: Path) -> None:
    told = vllm.KvEvents.connecting("127.0.0.1:5557", "kv@127.0.0.2@tiny-llama", engine_host="127.0.0.2")
    engine = vllm.VllmEngine(tmp_path, name="vllm-c", host="127.0.0.2", port=8123, kv_events=told)
    engine.start()
    first, second = starts.argvs
    assert arg(first, "--port") == arg(second, "--port") == "8123"
    (pub1, replay1), (pub2, replay2) = kv_ports(first), kv_ports(second)
    assert pub1 == pub2 == "tcp://127.0.0.1:5557"
    assert replay2 != replay1 and replay2.startswith("tcp://127.0.0.2:")


def test_a_start_that_failed_for_another_reason_is_not_tried_again(monkeypatch: pytest.MonkeyPatch,
                                                                  tmp_path: Path) -> None:
    monkeypatch.setattr(vllm, "available", lambda: True)
    tries: list[int] = []

    def fails(proc: ManagedProc, timeout: float | None = None) -> ManagedProc:
        tries.append(1)
        proc.log_dir.mkdir(parents=True, exist_ok=True)
        proc.log_path.write_text("RuntimeError: out of memory\n")
        raise ProcError("exited")

    monkeypatch.setattr(ManagedProc, "start", fails)
    with pytest.raises(ProcError):
        vllm.VllmEngine(tmp_path, name="vllm-a", kv_events=vllm.KvEvents.bound()).start()
    assert len(tries) == 1
