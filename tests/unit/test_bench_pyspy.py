"""py-spy's raw stacks summarised (bench/pyspy.py): own and total time, threads, and waits left out."""

from __future__ import annotations

from bench.pyspy import file_of, function_of, name_of, own_code, parse_raw, summary

RAW = [
    # the event loop deciding: Python frames above a native leaf
    "thread (0x10): MainThread;main (loadaware/cli.py:10);decide (loadaware/routing/pipeline.py:75);"
    "walk (loadaware/prefix/blocks.py:40) 30",
    "thread (0x10): MainThread;main (loadaware/cli.py:10);decide (loadaware/routing/pipeline.py:80);"
    "sendmsg (libc.so.6) 10",
    # the same loop blocked in epoll: waiting, not CPU
    "thread (0x10): MainThread;main (loadaware/cli.py:10);uv_run (core.c:464);epoll_pwait (libc.so.6) 100",
    # a tokenizer pool thread (pool numbers fold), waiting on its queue, and working
    "thread (0x11): tokenize_0;_worker (concurrent/futures/thread.py:81);PyThread_acquire_lock_timed "
    "(libpython3.11.so.1.0);0x7f00 (libc.so.6) 50",
    "thread (0x12): tokenize_1;_worker (concurrent/futures/thread.py:81);encode (tokenizers.abi3.so) 20",
    # recursion: a frame twice on one stack counts once in total time
    "thread (0x10): MainThread;rec (x.py:1);rec (x.py:2) 5",
    "garbage line",
]


def test_frames_lose_their_line_numbers_and_keep_their_file() -> None:
    assert function_of("walk (loadaware/prefix/blocks.py:40)") == "walk (loadaware/prefix/blocks.py)"
    assert function_of("sendmsg (libc.so.6)") == "sendmsg (libc.so.6)"
    assert name_of("epoll_wait (libc.so.6)") == "epoll_wait"
    assert file_of("walk (loadaware/prefix/blocks.py:40)") == "loadaware/prefix/blocks.py"


def test_waits_are_left_out_and_the_rest_is_ranked() -> None:
    prof = parse_raw(RAW)
    assert prof.waiting == 150 and prof.samples == 65
    assert prof.own["walk (loadaware/prefix/blocks.py)"] == 30
    assert prof.own["sendmsg (libc.so.6)"] == 10
    assert prof.total["decide (loadaware/routing/pipeline.py)"] == 40  # two lines of one function
    assert prof.total["rec (x.py)"] == 5  # recursion counted once
    assert prof.threads == {"MainThread": 45, "tokenize_N": 20}
    assert prof.files["libc.so.6"] == 10
    assert set(own_code(prof)) == {"main (loadaware/cli.py)", "decide (loadaware/routing/pipeline.py)",
                                   "walk (loadaware/prefix/blocks.py)"}


def test_summary_lists_percentages_of_the_busy_samples() -> None:
    text = summary(parse_raw(RAW), n=3, title="T")
    assert text.startswith("T\n65 busy samples ranked below; 150 more were blocked")
    assert " 46.2%      30  walk (loadaware/prefix/blocks.py)" in text
    assert "Top 3 functions by own time" in text and "tokenize_N" in text
    assert summary(parse_raw([]), title="T") == "T\nno samples\n"
