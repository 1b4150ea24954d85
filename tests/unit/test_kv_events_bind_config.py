"""The engines-connect settings: --kv-events-bind and --kv-events-topic-map parse, combine and wire."""

from __future__ import annotations

import pytest

from loadaware.config import ConfigError, resolve
from loadaware.prefix.lmcache.bridge import InstanceBridge
from loadaware.prefix.sources.kv_events import KvEventsParts
from loadaware.prefix.spec import BuildContext
from loadaware.prefix.wiring import PrefixOptions, PrefixWiring
from loadaware.telemetry.metrics import Metrics


def test_bind_and_topic_map_parse() -> None:
    s = resolve({"prefix_source": "kv-events", "kv_events_bind": "0.0.0.0:5557",
                 "kv_events_topic_map": "kv@10.0.0.5@m=10.0.0.5:8000, engine-b=10.0.0.6:8001"})
    assert s.kv_events_bind == "0.0.0.0:5557"
    assert dict(s.kv_events_topic_map) == {"kv@10.0.0.5@m": "10.0.0.5:8000", "engine-b": "10.0.0.6:8001"}
    env = resolve({}, {"LOADAWARE_PREFIX_SOURCE": "kv-events", "LOADAWARE_KV_EVENTS_BIND": "[::]:5557"})
    assert env.kv_events_bind == "[::]:5557" and env.origins["kv_events_bind"] == "env"


@pytest.mark.parametrize(("flags", "message"), [
    ({"kv_events_bind": "0.0.0.0:5557"}, "--kv-events-bind"),  # no kv-events source to feed
    ({"prefix_source": "kv-events", "kv_events_bind": "nowhere"}, "--kv-events-bind"),
    ({"prefix_source": "kv-events", "kv_events_topic_map": "topic-without-endpoint"}, "--kv-events-topic-map"),
    ({"prefix_source": "kv-events", "kv_events_topic_map": "t=10.0.0.5"}, "--kv-events-topic-map"),
])
def test_bad_values_are_refused_naming_the_flag(flags: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        resolve(flags, {})


def test_bind_turns_off_dialling_and_adds_the_inbound_task() -> None:
    def wiring(bind: str) -> KvEventsParts:
        built = PrefixWiring(PrefixOptions(("kv-events",), True, {"kv_events_bind": bind}), BuildContext(
            Metrics("loadaware"), lambda: ("10.0.0.5:8000",), InstanceBridge()))
        parts = built.parts["kv-events"]
        assert isinstance(parts, KvEventsParts) and getattr(built.source, "source", None) is parts.source
        return parts
    dialling = wiring("")
    assert dialling.inbound is None and dialling.feeds.pub_port == 5557
    bound = wiring("127.0.0.1:0")
    assert bound.inbound is not None and bound.feeds.pub_port == 0
    assert [name for name, _ in bound.tasks()] == ["kv-events", "kv-events-inbound"]
    assert bound.state()["inbound"]["bind"] == "tcp://127.0.0.1:0"  # type: ignore[index]
