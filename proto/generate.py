"""Compile proto/loadaware/v1/*.proto into loadaware/api/v1/ with grpcio-tools, or check the checked-in code.

    python proto/generate.py          # regenerate (what `make proto` runs)
    python proto/generate.py --check  # exit 1 when the checked-in code is stale (CI, `make test`)

protoc writes `from loadaware.v1 import loadaware_pb2` into the gRPC stubs (the import follows the .proto
path); the stubs live inside the loadaware package, so that import is rewritten to a relative one.
The check ignores the lines that only record the generator's version, so a newer grpcio-tools on another
machine does not count as "stale" while the API itself is unchanged.
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
from importlib import resources
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PROTO_ROOT = REPO / "proto"
PACKAGE_DIR = Path("loadaware") / "v1"
OUT_DIR = REPO / "loadaware" / "api" / "v1"
SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")

# Lines that name the generator's version, not the API: ignored by --check.
_VERSION_LINES = re.compile(r"^(# Protobuf Python Version:.*|GRPC_GENERATED_VERSION = .*|\s+\d+,\s*$|"
                            r"_runtime_version\.ValidateProtobufRuntimeVersion\(.*)$", re.M)


def _protos() -> list[Path]:
    return sorted((PROTO_ROOT / PACKAGE_DIR).glob("*.proto"))


def _compile(into: Path) -> dict[str, str]:
    from grpc_tools import protoc

    well_known = str(resources.files("grpc_tools") / "_proto")
    args = ["protoc", f"-I{PROTO_ROOT}", f"-I{well_known}", f"--python_out={into}", f"--pyi_out={into}",
            f"--grpc_python_out={into}", *(str(p.relative_to(PROTO_ROOT)) for p in _protos())]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    out: dict[str, str] = {}
    for path in sorted((into / PACKAGE_DIR).iterdir()):
        if path.name.endswith(SUFFIXES):
            text = path.read_text()
            module = ".".join(PACKAGE_DIR.parts)
            text = re.sub(rf"^from {re.escape(module)} import ", "from . import ", text, flags=re.M)
            out[path.name] = text
    return out


def _normalize(text: str) -> str:
    return _VERSION_LINES.sub("", text)


def generate() -> dict[str, str]:
    with tempfile.TemporaryDirectory() as tmp:
        return _compile(Path(tmp))


def stale_files(generated: dict[str, str]) -> list[str]:
    stale = []
    for name, text in generated.items():
        current = OUT_DIR / name
        if not current.exists() or _normalize(current.read_text()) != _normalize(text):
            stale.append(name)
    known = {p.name for p in OUT_DIR.glob("*") if p.name.endswith(SUFFIXES)}
    stale += sorted(known - set(generated))  # generated code whose .proto is gone
    return stale


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if the checked-in code is stale")
    ns = parser.parse_args(argv)
    generated = generate()
    if ns.check:
        stale = stale_files(generated)
        if stale:
            print(f"stale generated code in {OUT_DIR.relative_to(REPO)}: {', '.join(stale)}; run `make proto`",
                  file=sys.stderr)
            return 1
        print(f"{OUT_DIR.relative_to(REPO)} is up to date with proto/")
        return 0
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    for name, text in generated.items():
        (OUT_DIR / name).write_text(text)
    print(f"wrote {', '.join(sorted(generated))} to {OUT_DIR.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
