"""One int object per vocabulary id, shared by every prompt's list of token ids.

Why: `tokenizers` hands back a new int object for every id above 256, and so does copying ids out of an
`array`. A request's ids live while it waits for admission, is decided and recorded: a ~1,600-token prompt is
~50 KB of 32-byte int objects in Python's small-object arenas, interleaved with whatever was allocated meanwhile.
An arena goes back to the system only when every object in it is gone, so a burst of held requests leaves
arenas pinned by the few long-lived objects made during it: resident memory that steps up at each new peak and
stays (docs/memory.md, December 7). With shared ints a prompt's list holds references only (8 B a token in one
malloc block, handed back whole when freed), and a cached piece is copied into a prompt by reference.

Cost: the table, one int per id made at load (~40 B an id: ~6 MiB for a 151k vocabulary), and a lookup per
fresh id (a C-level map; its time per token is in docs/memory.md).
"""

from __future__ import annotations

from collections.abc import Sequence

MAX_SHARED_IDS = 1 << 21  # ~84 MiB of table at most; the largest vocabularies in use are ~260k ids


class SharedIds:
    """`shared(ids)`: the same ids as a new list whose items are the table's int objects."""

    def __init__(self, id_space: int) -> None:
        # ids at or past MAX_SHARED_IDS (no tokenizer in use comes near) come back as they were: a bounded table
        self._table: list[int] = list(range(min(max(0, id_space), MAX_SHARED_IDS)))
        self._item = self._table.__getitem__

    def __len__(self) -> int:
        return len(self._table)

    def __getitem__(self, token_id: int) -> int:
        """The shared int object of `token_id`."""
        return self._table[token_id]

    def __call__(self, ids: Sequence[int]) -> list[int]:
        try:
            return list(map(self._item, ids))
        except (IndexError, TypeError):  # an id outside the vocabulary (never from its own tokenizer): as it came
            return list(ids)
