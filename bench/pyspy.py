"""py-spy's raw (collapsed-stack) output, summarised: where a process spends its samples.

Each line of `py-spy record --format raw [--threads]` is `frame;frame;...;leaf COUNT`, root first; with
`--threads` the root is `thread (TID): NAME`. A Python frame reads `function (file:line)`, a native one
`symbol (library)` or `0xADDR (library)`. Own time is where a sample's leaf is; total time counts a frame
once per sample in which it appears (recursion must not count twice).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

_THREAD = re.compile(r"^thread \((?:0x)?[0-9a-fA-F]+\)(?::\s*(?P<name>.*))?$")
_LINE = re.compile(r":\d+\)$")
_FRAME_FILE = re.compile(r"\((?P<file>[^()]*)\)$")
_POOL_SUFFIX = re.compile(r"_\d+$")


@dataclass
class Profile:
    samples: int = 0
    own: Counter[str] = field(default_factory=Counter)
    total: Counter[str] = field(default_factory=Counter)
    threads: Counter[str] = field(default_factory=Counter)  # samples by thread name (pool numbers folded)
    files: Counter[str] = field(default_factory=Counter)  # own samples by source file or native library


def function_of(frame: str) -> str:
    """A frame without its line number: one function is one entry whatever line was running."""
    return _LINE.sub(")", frame.strip())


def file_of(frame: str) -> str:
    m = _FRAME_FILE.search(function_of(frame))
    return m.group("file") if m else frame


def parse_raw(lines: Iterable[str]) -> Profile:
    prof = Profile()
    for line in lines:
        stack, sep, count_text = line.rstrip("\n").rpartition(" ")
        if not sep or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = stack.split(";")
        thread = "all"
        m = _THREAD.match(frames[0])
        if m:
            thread = _POOL_SUFFIX.sub("_N", (m.group("name") or "unnamed").strip())
            frames = frames[1:]
        if not frames:
            continue
        funcs = [function_of(f) for f in frames]
        prof.samples += count
        prof.threads[thread] += count
        prof.own[funcs[-1]] += count
        prof.files[file_of(funcs[-1])] += count
        for func in set(funcs):
            prof.total[func] += count
    return prof


def _top(counter: Counter[str], samples: int, n: int) -> list[str]:
    return [f"{count / samples:6.1%} {count:7d}  {name}" for name, count in counter.most_common(n)]


def summary(prof: Profile, n: int = 25, title: str = "") -> str:
    """Top `n` functions by own and by total samples, and own samples by thread and by file/library."""
    if prof.samples == 0:
        return f"{title}\nno samples\n"
    out = [title] if title else []
    out.append(f"{prof.samples} samples (busy threads only: idle ones are not sampled)")
    for heading, counter in ((f"Top {n} functions by own time (leaf of the sample)", prof.own),
                             (f"Top {n} functions by total time (anywhere on the stack)", prof.total),
                             ("Own time by thread", prof.threads),
                             ("Own time by file or native library (top 15)", prof.files)):
        limit = 15 if counter is prof.files else n
        out += ["", heading, "     %   samples  function (file)" if counter is not prof.threads else
                "     %   samples  thread", *_top(counter, prof.samples, limit)]
    return "\n".join(out) + "\n"
