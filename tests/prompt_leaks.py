"""Shared by the tenant-safety tests: does a document an operator can read show a prompt's text or token ids?

A prefix-cache-aware router may say *that* a prompt was recently served (which is why its debug API is on a
loopback admin port), but no reply, page or metric may say *what* the prompt was.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

WINDOW = 3  # this many consecutive token ids of the prompt, anywhere, count as showing it


def int_runs(doc: Any) -> Iterator[list[int]]:
    """Every list of integers in a JSON document."""
    if isinstance(doc, list):
        if doc and all(isinstance(x, int) and not isinstance(x, bool) for x in doc):
            yield doc
        for x in doc:
            yield from int_runs(x)
    elif isinstance(doc, dict):
        for x in doc.values():
            yield from int_runs(x)


def assert_no_prompt(where: str, doc: Any, raw: str, words: Iterable[str], token_ids: Sequence[int]) -> None:
    """Neither any of the prompt's distinctive `words` (case-insensitive) in the document's text `raw`, nor any
    WINDOW consecutive ids of `token_ids` in a list of the document or written out in its text."""
    text = raw.lower()
    for word in words:
        # A word standing alone, not inside a longer number: a prompt's "4471" must not match the digits of a
        # timestamp or a duration the page shows (1764904471.2, 0.4471 ms).
        shown = re.search(rf"(?<![0-9.]){re.escape(word.lower())}(?![0-9])", text)
        assert shown is None, f"{where} shows the prompt ({word!r})"
    windows = {tuple(token_ids[i:i + WINDOW]) for i in range(len(token_ids) - WINDOW + 1)}
    for run in int_runs(doc):
        assert not windows & {tuple(run[i:i + WINDOW]) for i in range(len(run) - WINDOW + 1)}, \
            f"{where} shows token ids"
    squeezed = text.replace(" ", "").replace("\n", "")
    for window in windows:
        assert ",".join(map(str, window)) not in squeezed, f"{where} shows token ids {window}"
