"""py-spy's raw (collapsed-stack) output, summarised: where a process spends its samples.

Each line of `py-spy record --format raw [--threads]` is `frame;frame;...;leaf COUNT`, root first; with
`--threads` the root is `thread (TID): NAME`. A Python frame reads `function (file:line)`, a native one
`symbol (library)` or `0xADDR (library)`. Own time is where a sample's leaf is; total time counts a frame
once per sample in which it appears (recursion must not count twice).

py-spy asks the OS whether a thread is running just before pausing it, which races: in a busy container many
samples of threads blocked in epoll or on a lock come through as active. With native frames (`--native`)
such a sample shows the blocking call itself, so a sample with one of WAIT_CALLS on its stack is counted as
waiting and left out of the rankings: what remains is CPU (about CPU-seconds x sampling rate of samples).
Waiting for the GIL (take_gil's condition variable) is waiting too.
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
WAIT_CALLS = frozenset({
    "epoll_wait", "epoll_pwait", "epoll_pwait2", "poll", "ppoll", "select", "pselect", "pselect6", "nanosleep",
    "clock_nanosleep", "pthread_cond_wait", "pthread_cond_timedwait", "pthread_cond_clockwait", "sem_wait",
    "sem_timedwait", "sem_clockwait", "PyThread_acquire_lock_timed", "take_gil", "accept", "accept4",
})


@dataclass
class Profile:
    samples: int = 0  # busy: the rankings' denominator
    waiting: int = 0  # left out: a blocking call on the stack
    own: Counter[str] = field(default_factory=Counter)
    total: Counter[str] = field(default_factory=Counter)
    threads: Counter[str] = field(default_factory=Counter)  # samples by thread name (pool numbers folded)
    files: Counter[str] = field(default_factory=Counter)  # own samples by source file or native library


def function_of(frame: str) -> str:
    """A frame without its line number: one function is one entry whatever line was running."""
    return _LINE.sub(")", frame.strip())


def name_of(frame: str) -> str:
    """The function or symbol alone: `epoll_wait (libc.so.6)` -> `epoll_wait`."""
    return frame.strip().split(" (", 1)[0]


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
        if any(name_of(f) in WAIT_CALLS for f in frames):
            prof.waiting += count
            continue
        funcs = [function_of(f) for f in frames]
        prof.samples += count
        prof.threads[thread] += count
        prof.own[funcs[-1]] += count
        prof.files[file_of(funcs[-1])] += count
        for func in set(funcs):
            prof.total[func] += count
    return prof


def own_code(prof: Profile, package: str = "loadaware/") -> Counter[str]:
    """Total time of the project's functions only: where a change in our code can cut CPU."""
    return Counter({f: c for f, c in prof.total.items() if f"({package}" in f})


def _top(counter: Counter[str], samples: int, n: int) -> list[str]:
    return [f"{count / samples:6.1%} {count:7d}  {name}" for name, count in counter.most_common(n)]


def summary(prof: Profile, n: int = 25, title: str = "") -> str:
    """Top `n` functions by own and by total samples, and own samples by thread and by file/library."""
    if prof.samples == 0:
        return f"{title}\nno samples\n"
    out = [title] if title else []
    out.append(f"{prof.samples} busy samples ranked below; {prof.waiting} more were blocked in a wait "
               "(epoll, a lock, the GIL) and are left out")
    for heading, counter in ((f"Top {n} functions by own time (leaf of the sample)", prof.own),
                             (f"Top {n} functions by total time (anywhere on the stack)", prof.total),
                             (f"Top {n} of the sidecar's own functions (loadaware/) by total time", own_code(prof)),
                             ("Own time by thread", prof.threads),
                             ("Own time by file or native library (top 15)", prof.files)):
        limit = 15 if counter is prof.files else n
        out += ["", heading, "     %   samples  function (file)" if counter is not prof.threads else
                "     %   samples  thread", *_top(counter, prof.samples, limit)]
    return "\n".join(out) + "\n"
