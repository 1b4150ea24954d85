"""Sequence rules of one engine's KV-event feed (pure): apply, skip duplicates, replay gaps, restarts."""

from __future__ import annotations

from loadaware.prefix.kvevents.sync import FeedSync, Verdict


def test_in_order_from_zero() -> None:
    s = FeedSync()
    for seq in range(3):
        assert s.classify(seq) is Verdict.APPLY
        s.applied(seq, live=True)
    assert s.last == 2 and s.replay_from == 3


def test_joining_late_replays_from_zero() -> None:
    s = FeedSync()
    assert s.classify(7) is Verdict.JOIN and s.replay_from == 0
    # whatever the replay buffer still has is a suffix of the history: applied in order on an empty index
    assert s.accept_replayed(3) is Verdict.APPLY
    s.applied(3, live=False)
    assert s.accept_replayed(4) is Verdict.APPLY
    s.applied(4, live=False)
    assert s.accept_replayed(4) is Verdict.STALE


def test_gap_asks_for_a_replay_from_the_first_missing_number() -> None:
    s = FeedSync(last=4, floor=4)
    assert s.classify(8) is Verdict.GAP and s.replay_from == 5
    assert s.accept_replayed(5) is Verdict.APPLY
    s.applied(5, live=False)
    assert s.accept_replayed(7) is Verdict.GAP  # the replay skipped 6: hidden removals, clear and go on


def test_duplicates_after_a_replay_are_stale_but_a_new_publisher_is_a_restart() -> None:
    s = FeedSync(last=4, floor=4)
    for seq in (5, 6, 7):  # replayed while live 5..7 queued in the socket
        s.applied(seq, live=False)
    assert s.classify(6) is Verdict.STALE and s.classify(7) is Verdict.STALE
    assert s.classify(8) is Verdict.APPLY
    s.applied(8, live=True)
    assert s.classify(0) is Verdict.RESTART  # numbering went back: a restarted engine
    assert s.classify(3) is Verdict.RESTART
    s.reset()
    assert s.classify(0) is Verdict.APPLY and s.last is None
