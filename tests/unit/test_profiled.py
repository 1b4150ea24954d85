"""testkit/profiled.py: the sidecar under memray, as SidecarProc's command."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from testkit import profiled
from testkit.sidecar import SidecarProc


def test_the_sidecar_runs_under_memray_when_it_is_there(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(profiled.importlib.util, "find_spec",
                        lambda name, *a: object() if name == "memray" else real(name, *a))
    out = tmp_path / "captures" / "picker.bin"
    command = profiled.memray_sidecar(out)
    assert command[1:4] == ["-m", "memray", "run"] and "--native" in command
    assert command[command.index("-o") + 1] == str(out) and out.parent.is_dir()
    assert command[-2:] == ["-m", "loadaware.cli"]  # memray's -m ends its options: the sidecar's follow
    sidecar = SidecarProc(["--listen", "127.0.0.1:1"], log_dir=tmp_path, command=command)
    assert sidecar.argv[:len(command) + 3] == [*command, "serve", "--listen", "127.0.0.1:1"]
    own = SidecarProc.command()
    assert SidecarProc(["--listen", "127.0.0.1:1"], log_dir=tmp_path).argv[:len(own) + 1] == [*own, "serve"]


def test_without_memray_the_probe_stops_before_starting_anything(monkeypatch: pytest.MonkeyPatch,
                                                                 tmp_path: Path) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(profiled.importlib.util, "find_spec",
                        lambda name, *a: None if name == "memray" else real(name, *a))
    with pytest.raises(SystemExit, match="needs memray"):
        profiled.memray_sidecar(tmp_path / "x.bin")
    assert not (tmp_path / "x.bin").exists()
