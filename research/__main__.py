"""An experiment command with the research arms registered: `python -m research MODULE [ARGS...]`.

    python -m research grid --credit gpu --ours predictive --seeds 20 --out out/experiment/grid-predictive
    python -m research config_grid --no-peers --arms lane-spread-cold-loadaware --first-seed 1 --seeds 2
    python -m research scenarios --role design --ours banded --arms banded-0.5,banded-1
    python -m research des_run --arms kvaware,predictive --seeds 5

MODULE is a module of the `experiment` package with a `main(argv)` (grid, config_grid, scenarios, des_run,
agentic, realtime.crosscheck, ...); it runs exactly as `python -m experiment.MODULE` does, except that arm
names also resolve to the research arms (research/arms.py): the experiment never imports them itself.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Sequence
from typing import cast

import research.arms  # noqa: F401  (registers the research arms: the reason this runner exists)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if args else 2
    name, rest = args[0].removeprefix("experiment."), args[1:]
    try:
        module = importlib.import_module(f"experiment.{name}")
    except ModuleNotFoundError:
        print(f"python -m research: no module experiment.{name}", file=sys.stderr)
        return 2
    run = getattr(module, "main", None)
    if run is None:
        print(f"python -m research: experiment.{name} has no main()", file=sys.stderr)
        return 2
    sys.argv = [f"python -m research {name}", *rest]
    return int(cast(Callable[[list[str]], int | None], run)(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
