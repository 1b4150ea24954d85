"""`file`: the fleet is the lines (or commas) of --endpoints-file, re-read when it changes (discovery/file.py).
The first set is read at build, before the first stream."""

from __future__ import annotations

from dataclasses import dataclass

from loadaware.fleet.discovery.file import EndpointsFileWatcher
from loadaware.fleet.discovery.spec import Backend, DiscoveryContext, Task


@dataclass(frozen=True)
class FileOptions:
    endpoints_file: str = ""


def _build(o: FileOptions, context: DiscoveryContext) -> list[tuple[str, Task]]:
    watcher = EndpointsFileWatcher(o.endpoints_file, context.registry)
    watcher.poll()  # the first set is in before the first stream
    return [("endpoints-file", watcher.run)]


def _check(o: FileOptions) -> str | None:
    return None if o.endpoints_file else "--discovery: file needs --endpoints-file"


FILE = Backend("file", _build, FileOptions, check=_check)
