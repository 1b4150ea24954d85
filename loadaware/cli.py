"""`loadaware-sidecar serve [flags]` and `loadaware-sidecar config [flags]`."""

from __future__ import annotations

import asyncio
import gc
import json
import sys
from collections.abc import Sequence

from loadaware.config import ConfigError, from_args
from loadaware.telemetry.logs import configure

GC_YOUNG_THRESHOLD = 20_000  # Python's default is 700

USAGE = """usage: loadaware-sidecar {serve,config} [flags]

  serve   run the Envoy ext_proc routing server
  config  print the effective configuration (flag > env > default) and exit

Run 'loadaware-sidecar serve --help' for the flags.
"""


def settle_heap() -> None:
    """What start-up built (tokenizer, templates, config, the fleet known at start) lives as long as the
    process: out of the collector's way; and fewer young-generation collections per request (each request
    allocates a few thousand objects)."""
    gc.freeze()
    gc.set_threshold(GC_YOUNG_THRESHOLD, 20, 20)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if args else 2
    command, rest = args[0], args[1:]
    if command not in ("serve", "config"):
        print(f"loadaware-sidecar: unknown command {command!r}\n\n{USAGE}", file=sys.stderr)
        return 2
    try:
        settings = from_args(rest)
    except ConfigError as exc:
        print(f"loadaware-sidecar: configuration refused: {exc}", file=sys.stderr)
        return 2
    configure(settings.log_level)
    if command == "config":
        print(json.dumps(settings.describe(), indent=2))
        return 0
    from loadaware.collector import cap_malloc_arenas

    cap_malloc_arenas(settings.malloc_arena_max)  # before any thread of the sidecar's allocates
    from loadaware.app import Sidecar  # heavy imports only when serving

    try:
        sidecar = Sidecar(settings)
    except (OSError, ValueError, Exception) as exc:  # noqa: BLE001 - a startup failure names its cause
        print(f"loadaware-sidecar: cannot start: {exc}", file=sys.stderr)
        return 2
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    settle_heap()
    try:
        asyncio.run(sidecar.run_until_signalled())
    except OSError as exc:
        print(f"loadaware-sidecar: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
