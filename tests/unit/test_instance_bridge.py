"""LMCache instance id -> endpoint: only live ids are credited. The controller may still list an instance
whose engine has gone, or one we cannot place, and crediting it would send traffic after a cache that is not
there: prefix credit may under-credit, never over-credit (docs/architecture.md, "Invariants")."""

from __future__ import annotations

from loadaware.prefix.lmcache.bridge import InstanceBridge, WorkerRecord

FLEET = ("127.0.0.2:8000", "127.0.0.3:8000", "127.0.0.4:8000")


def bridge(*workers: WorkerRecord, explicit: dict[str, str] | None = None) -> InstanceBridge:
    b = InstanceBridge(explicit)
    b.set_endpoints(FLEET)
    b.apply_workers(workers, complete=True)
    return b


def test_maps_by_ip() -> None:
    b = bridge(WorkerRecord("engine-a", "127.0.0.2", 1.0), WorkerRecord("engine-b", "127.0.0.3", 1.0))
    credit = b.credit({"engine-a": 512, "engine-b": 256}, FLEET)
    assert credit.matches == {"127.0.0.2:8000": 512, "127.0.0.3:8000": 256}
    assert b.instance_for("127.0.0.4:8000") is None and b.unmapped(FLEET) == ["127.0.0.4:8000"]


def test_unmapped_holder_gets_no_credit_and_asks_for_refresh() -> None:
    b = bridge(WorkerRecord("engine-a", "127.0.0.2", 1.0))
    credit = b.credit({"engine-zz": 1024}, FLEET)
    assert credit.matches == {} and credit.unknown_ids == ("engine-zz",)
    b.apply_workers([WorkerRecord("engine-zz", "127.0.0.4", 2.0)], complete=False, queried_ids=["engine-zz"])
    assert b.credit({"engine-zz": 1024}, FLEET).matches == {"127.0.0.4:8000": 1024}


def test_two_ids_for_one_endpoint_only_the_live_one_is_credited() -> None:
    # the engine restarted under a new id; the old registration lingers in the controller
    b = bridge(WorkerRecord("engine-a-old", "127.0.0.2", 10.0), WorkerRecord("engine-a-new", "127.0.0.2", 20.0))
    credit = b.credit({"engine-a-old": 2048, "engine-a-new": 256}, FLEET)
    assert credit.matches == {"127.0.0.2:8000": 256}
    assert credit.ignored_ids == ("engine-a-old",) and credit.unknown_ids == ()


def test_dead_id_gets_no_phantom_credit() -> None:
    b = bridge(WorkerRecord("engine-a", "127.0.0.2", 1.0), WorkerRecord("engine-b", "127.0.0.3", 1.0))
    b.apply_workers([WorkerRecord("engine-b", "127.0.0.3", 1.0)], complete=True)  # engine-a deregistered
    credit = b.credit({"engine-a": 1024}, FLEET)
    assert credit.matches == {} and credit.ignored_ids == ("engine-a",) and credit.unknown_ids == ()
    # asked by name and not found: dead as well
    b.apply_workers([], complete=False, queried_ids=["engine-b"])
    assert b.credit({"engine-b": 256}, FLEET).matches == {}


def test_holder_outside_the_fleet_or_vanished_endpoint() -> None:
    b = bridge(WorkerRecord("engine-a", "127.0.0.2", 1.0))
    assert b.credit({"engine-a": 512}, ("127.0.0.3:8000",)).matches == {}
    b.set_endpoints(("127.0.0.3:8000",))
    assert b.credit({"engine-a": 512}, ("127.0.0.3:8000",)).matches == {}


def test_explicit_map_is_authoritative_and_needed_for_shared_ips() -> None:
    fleet = ("10.0.0.1:8000", "10.0.0.1:8001")
    b = InstanceBridge({"pod-b": "10.0.0.1:8001"})
    b.set_endpoints(fleet)
    b.apply_workers([WorkerRecord("pod-a", "10.0.0.1", 1.0), WorkerRecord("pod-b", "10.0.0.1", 1.0)], complete=True)
    credit = b.credit({"pod-a": 256, "pod-b": 512}, fleet)
    assert credit.matches == {"10.0.0.1:8001": 512}  # pod-a is ambiguous by ip: no credit, not a guess


def test_maps_ipv6_workers_whatever_spelling_lmcache_reports() -> None:
    fleet = ("[fd00::2]:8000", "[fd00::3]:8000")
    b = InstanceBridge()
    b.set_endpoints(fleet)
    b.apply_workers([WorkerRecord("engine-a", "fd00:0:0:0:0:0:0:2", 1.0), WorkerRecord("engine-b", "[FD00::3]", 1.0)],
                    complete=True)
    assert b.credit({"engine-a": 512, "engine-b": 256}, fleet).matches == {"[fd00::2]:8000": 512,
                                                                           "[fd00::3]:8000": 256}
