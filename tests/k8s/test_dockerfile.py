"""The Dockerfile, read rather than built (no docker here): multi-stage, slim, non-root, no compilers in
the runtime stage; what it COPYs exists and survives .dockerignore; and the build context it sees really
builds the package with the generated API and the console script."""

from __future__ import annotations

import fnmatch
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = (REPO / "Dockerfile").read_text()


def instructions() -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", DOCKERFILE)
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def stages() -> list[list[tuple[str, str]]]:
    result: list[list[tuple[str, str]]] = []
    for instruction in instructions():
        if instruction[0] == "FROM":
            result.append([])
        if result:
            result[-1].append(instruction)
    return result


def ignored(path: str) -> bool:
    """Docker's .dockerignore rule: the last matching pattern wins; `!` re-includes."""
    verdict = False
    for raw in (REPO / ".dockerignore").read_text().splitlines():
        pattern = raw.strip()
        if not pattern or pattern.startswith("#"):
            continue
        negate = pattern.startswith("!")
        pattern = pattern.lstrip("!").rstrip("/")
        parts = path.split("/")
        prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
        if any(fnmatch.fnmatch(p, pattern) or fnmatch.fnmatch(p, pattern.replace("**/", "*/"))
               or (pattern.startswith("**/") and fnmatch.fnmatch(parts[-1], pattern[3:])) for p in prefixes):
            verdict = not negate
    return verdict


def copied_sources() -> list[str]:
    sources = []
    for word, rest in instructions():
        if word == "COPY" and "--from=" not in rest:
            *srcs, _dest = rest.split()
            sources += srcs
    return sources


def test_multi_stage_slim_non_root_no_compilers_at_run_time() -> None:
    build, runtime = stages()
    assert build[0][1].endswith("AS build") and runtime[0][1].endswith("AS runtime")
    base = re.search(r"ARG PYTHON_IMAGE=(\S+)", DOCKERFILE)
    assert base and re.fullmatch(r"python:3\.1[1-9]-slim(-\w+)?", base.group(1))
    runtime_text = " ".join(rest for _, rest in runtime)
    assert not re.search(r"\b(gcc|g\+\+|build-essential|clang|make|apt-get install)\b", runtime_text)
    assert "COPY --from=build /opt/loadaware /opt/loadaware" in DOCKERFILE
    user = [rest for word, rest in runtime if word == "USER"]
    assert user == ["10001:10001"]  # numeric: runAsNonRoot can check it
    assert ("ENTRYPOINT", '["loadaware-sidecar"]') in runtime and ("CMD", '["serve"]') in runtime


def test_copied_files_exist_and_are_in_the_build_context() -> None:
    sources = copied_sources()
    assert sources
    for source in sources:
        assert (REPO / source).exists(), source
        assert not ignored(source), f"{source} is excluded by .dockerignore"
    for outside in ("tests/unit/test_api.py", "sim/engine.py", ".venv", "out/logs", "k8s/base/envoy.yaml"):
        assert ignored(outside), outside
    assert ignored("loadaware/__pycache__/app.cpython-311.pyc")


def test_image_matches_the_manifests() -> None:
    """The image exposes what its defaults serve on every interface (ext_proc + health, /metrics), which is
    what the endpoint picker's pod declares; the admin listeners are on loopback and never exposed."""
    from loadaware.config import from_args

    exposed = {int(p) for word, rest in instructions() if word == "EXPOSE" for p in rest.split()}
    env = dict(item.split("=", 1) for word, rest in stages()[-1] if word == "ENV" for item in rest.split())
    assert exposed == {int(env[name].rpartition(":")[2]) for name in ("LOADAWARE_LISTEN", "LOADAWARE_METRICS_LISTEN")}
    assert all(env[name].startswith("0.0.0.0:") for name in ("LOADAWARE_LISTEN", "LOADAWARE_METRICS_LISTEN"))
    defaults = from_args(["--endpoints", "10.0.0.1:8000"], environ=env)
    admin = {int(a.rpartition(":")[2]) for a in (defaults.admin_listen, defaults.admin_http_listen)}
    assert not exposed & admin and all(a.startswith("127.0.0.1:") for a in (defaults.admin_listen,
                                                                             defaults.admin_http_listen))
    picker = next(d for d in yaml.safe_load_all((REPO / "k8s/inference-pool/pool/picker-deployment.yaml").read_text()))
    (sidecar,) = picker["spec"]["template"]["spec"]["containers"]
    assert exposed == {p["containerPort"] for p in sidecar["ports"]}
    for path in ("k8s/base/deployment.yaml", "k8s/inference-pool/pool/picker-deployment.yaml"):
        deployment = next(d for d in yaml.safe_load_all((REPO / path).read_text()))
        for container in deployment["spec"]["template"]["spec"]["containers"]:
            if container["name"] == "loadaware-sidecar":
                assert container["securityContext"]["runAsUser"] == 10001
                assert not admin & {p["containerPort"] for p in container["ports"]}


def test_the_build_context_builds_the_package(tmp_path: Path) -> None:
    """What `pip install /src` in the build stage gets: a wheel with the generated API and the script."""
    context = tmp_path / "context"
    for source in copied_sources():
        src = REPO / source
        if src.is_dir():
            shutil.copytree(src, context / source, ignore=lambda d, names: [
                n for n in names if ignored(str((Path(d) / n).relative_to(REPO)))])
        else:
            (context / source).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(src, context / source)
    out = tmp_path / "wheels"
    result = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                             "-w", str(out), str(context)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    (wheel,) = out.glob("loadaware_sidecar-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "loadaware/api/v1/loadaware_pb2.py" in names and "loadaware/api/v1/loadaware_pb2_grpc.py" in names
    assert "loadaware/fleet/discovery/kubernetes.py" in names
    # only the product: the simulator, test kit, demo, bench and experiment never reach the image
    assert not any(n.startswith(("sim/", "testkit/", "demo/", "bench/", "experiment/", "tests/")) for n in names)
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "loadaware-sidecar = loadaware.cli:main" in zipfile.ZipFile(wheel).read(entry_points).decode()
