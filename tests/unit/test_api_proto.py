"""The checked-in generated code matches proto/ (CI fails when someone edits the .proto and forgets
`make proto`), and the check really notices a difference."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "proto"))
import generate  # noqa: E402  (proto/generate.py is a script, not a package)


def test_checked_in_code_is_current() -> None:
    result = subprocess.run([sys.executable, str(REPO / "proto" / "generate.py"), "--check"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


def test_check_fails_on_a_changed_proto(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    proto_root = tmp_path / "proto"
    shutil.copytree(REPO / "proto" / "loadaware", proto_root / "loadaware")
    out = tmp_path / "out"
    shutil.copytree(generate.OUT_DIR, out)
    monkeypatch.setattr(generate, "PROTO_ROOT", proto_root)
    monkeypatch.setattr(generate, "OUT_DIR", out)
    assert generate.stale_files(generate.generate()) == []
    proto = proto_root / "loadaware" / "v1" / "loadaware.proto"
    proto.write_text(proto.read_text().replace("message GetConfigRequest {}",
                                               "message GetConfigRequest { string only = 1; }"))
    assert generate.stale_files(generate.generate()) == ["loadaware_pb2.py", "loadaware_pb2.pyi"]


def test_generated_stubs_import_inside_the_package() -> None:
    from loadaware.api.v1 import loadaware_pb2, loadaware_pb2_grpc

    assert loadaware_pb2.DESCRIPTOR.package == "loadaware.v1"
    assert loadaware_pb2.DESCRIPTOR.name == "loadaware/v1/loadaware.proto"
    assert hasattr(loadaware_pb2_grpc, "add_RouterServicer_to_server")
    names = [m.name for m in loadaware_pb2.DESCRIPTOR.services_by_name["Router"].methods]
    assert names == ["Explain", "ListEndpoints", "GetConfig"]
