"""The command line every in-process bench case shares: run it, print its table (or its JSON record)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence
from typing import Any


def main(prog: str, doc: str | None, run: Callable[[bool], dict[str, Any]], table: Callable[[dict[str, Any]], str],
         argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=prog, description=(doc or "").splitlines()[0])
    p.add_argument("--quick", action="store_true", help="fewer iterations: a smoke run, not a measurement")
    p.add_argument("--json", action="store_true", help="print the JSON record instead of the table")
    args = p.parse_args(argv)
    result = run(args.quick)
    print(json.dumps(result, indent=2) if args.json else table(result))
    return 0
