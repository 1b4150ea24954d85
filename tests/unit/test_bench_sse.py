"""Counting SSE events in a body that arrives in arbitrary pieces (bench/sse.py)."""

from __future__ import annotations

import random

from bench.sse import SseCounter


def _stream(tokens: int) -> bytes:
    events = [b'data: {"choices":[{"index":0,"text":" tok%d"}]}\n\n' % i for i in range(tokens)]
    return b"".join(events) + b"data: [DONE]\n\n"


def _feed(pieces: list[bytes]) -> SseCounter:
    c = SseCounter()
    completed = sum(c.feed(p) for p in pieces)
    assert completed == c.events  # feed reports exactly what it added
    return c


def test_whole_body_counts_every_event_and_the_done_marker() -> None:
    c = _feed([_stream(64)])
    assert c.events == 65 and c.done


def test_every_split_point_gives_the_same_count() -> None:
    body = _stream(3)
    for cut in range(len(body) + 1):
        c = _feed([body[:cut], body[cut:]])
        assert (c.events, c.done) == (4, True), cut


def test_byte_by_byte_and_random_pieces() -> None:
    body = _stream(20)
    assert _feed([body[i:i + 1] for i in range(len(body))]).events == 21
    rng = random.Random(3)
    for _ in range(50):
        cuts = sorted(rng.sample(range(1, len(body)), 7))
        pieces = [body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)])]
        c = _feed(pieces)
        assert c.events == 21 and c.done


def test_separators_are_counted_left_to_right_without_overlap_across_pieces() -> None:
    # Runs of newlines: b"\n\n\n\n" holds two separators, b"\n\n\n" one, whichever way the bytes arrive.
    for body, expected in ((b"a\n\n\n\nb", 2), (b"a\n\n\nb\n\n", 2), (b"\n\n\n", 1), (b"\n" * 7, 3)):
        assert _feed([body]).events == expected
        for cut in range(len(body) + 1):
            assert _feed([body[:cut], body[cut:]]).events == expected, (body, cut)
        assert _feed([body[i:i + 1] for i in range(len(body))]).events == expected


def test_truncated_or_unfinished_streams_are_not_done() -> None:
    body = _stream(5)
    assert not _feed([body[:-1]]).done  # the last newline missing
    assert not _feed([_stream(5)[: -len(b"data: [DONE]\n\n")]]).done  # no [DONE] at all
    c = _feed([body, b'data: {"late":1}\n\n'])  # an event after [DONE]: the body no longer ends with it
    assert c.events == 7 and not c.done
    empty = SseCounter()
    assert empty.feed(b"") == 0 and empty.events == 0 and not empty.done
