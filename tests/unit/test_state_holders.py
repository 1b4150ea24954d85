"""Which engine holds each stored response: learned, bounded, and found by asking the engines (fleet/state_holders.py);
the id read from a response body as it streams by (extproc/response_ids.py)."""

from __future__ import annotations

import asyncio

import pytest

from loadaware.extproc.response_ids import READ_LIMIT, ResponseIdReader
from loadaware.fleet.state_holders import KNOWN, MISS_TTL_S, NOT_FOUND, PROBE_FAILED, PROBED, StateHolders

FLEET = ("10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000")


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Engines:
    """A probe: each engine holds some ids, may be slow, may fail."""

    def __init__(self, held: dict[str, set[str]], delay_s: float = 0.0, failing: frozenset[str] = frozenset()
                 ) -> None:
        self.held = held
        self.delay_s = delay_s
        self.failing = failing
        self.asked: list[tuple[str, str]] = []

    async def __call__(self, endpoint: str, response_id: str) -> bool:
        self.asked.append((endpoint, response_id))
        await asyncio.sleep(self.delay_s)
        if endpoint in self.failing:
            raise ConnectionError("refused")
        return response_id in self.held.get(endpoint, set())


async def test_a_learned_holder_is_known_until_its_ttl_and_a_use_extends_it() -> None:
    clock = Clock()
    holders = StateHolders(None, ttl_s=10.0, clock=clock)
    holders.learn("resp_1", FLEET[1])
    clock.now = 9.0
    assert await holders.locate("resp_1", FLEET) == (FLEET[1], KNOWN)  # used: another 10 s from now
    clock.now = 18.0
    assert holders.known("resp_1") == FLEET[1]
    clock.now = 28.5
    assert holders.known("resp_1") is None and len(holders) == 0


def test_the_map_is_bounded_least_recently_used_first() -> None:
    holders = StateHolders(None, max_entries=3)
    for i in range(3):
        holders.learn(f"r{i}", FLEET[i])
    assert holders.known("r0") == FLEET[0]  # r0 used: r1 is now the least recently used
    holders.learn("r3", FLEET[0])
    assert len(holders) == 3 and holders.known("r1") is None and holders.known("r0") == FLEET[0]


async def test_an_unknown_id_is_probed_once_and_remembered() -> None:
    engines = Engines({FLEET[2]: {"resp_x"}}, delay_s=0.01)
    holders = StateHolders(engines)
    found = await asyncio.gather(*(holders.locate("resp_x", FLEET) for _ in range(5)))
    assert found == [(FLEET[2], PROBED)] * 5
    assert len(engines.asked) <= len(FLEET)  # five concurrent lookups shared one probe
    assert await holders.locate("resp_x", FLEET) == (FLEET[2], KNOWN)
    assert len(engines.asked) <= len(FLEET)


async def test_an_id_nobody_holds_is_remembered_briefly() -> None:
    clock = Clock()
    engines = Engines({})
    holders = StateHolders(engines, clock=clock)
    assert await holders.locate("resp_lost", FLEET) == (None, NOT_FOUND)
    asked = len(engines.asked)
    assert asked == len(FLEET)
    assert await holders.locate("resp_lost", FLEET) == (None, NOT_FOUND)
    assert len(engines.asked) == asked  # within the miss ttl: not asked again
    clock.now = 10.0
    engines.held[FLEET[0]] = {"resp_lost"}  # it turned up (a slow replica's engine answered late)
    assert await holders.locate("resp_lost", FLEET) == (FLEET[0], PROBED)


async def test_misses_past_their_ttl_are_dropped_not_kept_until_the_bound() -> None:
    """A steady trickle of unknown ids keeps the misses of the last MISS_TTL_S only: the map must not grow to
    MAX_MISSES over hours (each entry an id string and a float)."""
    clock = Clock()
    holders = StateHolders(Engines({}), clock=clock)
    for n in range(200):
        clock.now = n * 0.5  # two unknown ids a second for 100 s
        assert await holders.locate(f"resp_gone_{n}", FLEET) == (None, NOT_FOUND)
    assert len(holders._misses) <= MISS_TTL_S / 0.5 + 1
    assert await holders.locate("resp_gone_199", FLEET) == (None, NOT_FOUND)  # the latest still remembered
    clock.now += MISS_TTL_S + 0.5
    await holders.locate("resp_gone_198", FLEET)  # asked again past its ttl: remembered anew, the rest expired
    assert list(holders._misses) == ["resp_gone_198"]


async def test_engines_that_cannot_tell_make_the_probe_fail_not_a_miss() -> None:
    engines = Engines({}, failing=frozenset({FLEET[0]}))
    holders = StateHolders(engines)
    assert await holders.locate("resp_y", FLEET) == (None, PROBE_FAILED)
    # A failure is not remembered as "nobody holds it": the next lookup asks again.
    await holders.locate("resp_y", FLEET)
    assert len(engines.asked) == 2 * len(FLEET)


async def test_a_probe_is_time_boxed() -> None:
    engines = Engines({FLEET[0]: {"resp_z"}}, delay_s=5.0)
    holders = StateHolders(engines, probe_timeout_s=0.05)
    assert await asyncio.wait_for(holders.locate("resp_z", FLEET), 2.0) == (None, PROBE_FAILED)


async def test_a_holder_that_left_the_fleet_is_forgotten_and_asked_again() -> None:
    engines = Engines({FLEET[1]: {"resp_m"}})
    holders = StateHolders(engines)
    holders.learn("resp_m", "10.9.9.9:8000")  # no longer in the fleet
    assert await holders.locate("resp_m", FLEET) == (FLEET[1], PROBED)


@pytest.mark.parametrize("cut", [1, 7, 12, 13, 19])
def test_the_id_is_read_across_chunks(cut: int) -> None:
    body = b'{"id": "resp_abc123", "object": "response", "output": [{"id": "msg_1"}]}'
    reader = ResponseIdReader()
    assert reader.feed(body[:cut]) is None
    assert reader.feed(body[cut:]) == "resp_abc123" and reader.done


def test_a_streams_first_event_names_the_response() -> None:
    event = b'event: response.created\ndata: {"response": {"id": "resp_s1", "created_at": 1}, "type": "x"}\n\n'
    assert ResponseIdReader().feed(event) == "resp_s1"


def test_reading_stops_at_the_limit() -> None:
    reader = ResponseIdReader()
    assert reader.feed(b" " * READ_LIMIT) is None and reader.done
    assert reader.feed(b'{"id": "late"}') is None


async def test_explain_reads_and_changes_nothing() -> None:
    from loadaware.lifecycle import preview

    clock = Clock()
    engines = Engines({FLEET[0]: {"resp_p"}})
    holders = StateHolders(engines, ttl_s=10.0, clock=clock)
    holders.learn("resp_known", FLEET[2])
    with preview():
        assert await holders.locate("resp_p", FLEET) == (FLEET[0], PROBED)
        assert await holders.locate("resp_nobody", FLEET[1:]) == (None, NOT_FOUND)
        clock.now = 9.0
        assert await holders.locate("resp_known", FLEET) == (FLEET[2], KNOWN)
    assert holders.known("resp_p") is None and len(holders) == 1
    clock.now = 10.5  # the preview's use did not extend the entry's life
    assert holders.known("resp_known") is None


async def test_probes_at_once_are_bounded() -> None:
    from loadaware.fleet.state_holders import MAX_PROBING, PROBE_BUSY

    engines = Engines({}, delay_s=0.2)
    holders = StateHolders(engines, probe_timeout_s=1.0)
    found = await asyncio.gather(*(holders.locate(f"resp_{i}", FLEET) for i in range(MAX_PROBING + 5)))
    assert found.count((None, PROBE_BUSY)) == 5
    assert len(engines.asked) == MAX_PROBING * len(FLEET)
