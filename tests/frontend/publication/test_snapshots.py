"""Snapshots and catch-up alone: what a stream is sent first, from a changelog."""

from __future__ import annotations

from svcproxy.frontend.computation.records import ServiceRecords
from svcproxy.frontend.publication.changelog import Changelog
from svcproxy.frontend.publication.snapshots import Snapshots
from svcproxy.frontend.sources.events import Replace, Upsert
from svcproxy.frontend.store.store import Store
from svcproxy.v1 import nodestate_pb2 as pb
from tests.support.objects import endpoint, node, service, slice_


def _setup() -> tuple[Store, Changelog, Snapshots]:
    store = Store()
    log = Changelog(store, ServiceRecords(store), history_limit=4)
    log.publish(store.apply([
        Replace("Node", [node("n1")]), Replace("Service", [service("web")]),
        Replace("EndpointSlice", [slice_("web-1", "web", [endpoint("10.0.0.1", "n1")])])]))
    log.start()
    return store, log, Snapshots(log)


def _events(msgs: object) -> list[pb.WatchEvent]:
    return [pb.WatchEvent.FromString(m) for m in msgs]  # type: ignore[attr-defined]


def _bump(store: Store, log: Changelog, ip: str) -> None:
    log.publish(store.apply([Upsert("EndpointSlice",
                                    slice_("web-1", "web", [endpoint(ip, "n1")]))]))


def test_a_new_client_gets_a_snapshot_with_the_views_digest() -> None:
    _, log, snaps = _setup()
    view = log.view("n1")
    cursor, msgs = snaps.catch_up(view, 0)
    events = _events(msgs)
    assert cursor == log.revision and not events[0].reset
    kinds = [op.WhichOneof("op") for ev in events for op in ev.ops]
    assert kinds.count("replace_service") == 1 and kinds.count("set_node") == 1
    assert events[-1].digest == view.digest


def test_a_client_behind_gets_what_it_missed_and_one_too_far_behind_a_reset() -> None:
    store, log, snaps = _setup()
    view = log.view("n1")
    start = log.revision
    assert list(snaps.catch_up(view, start)[1]) == []
    _bump(store, log, "10.0.0.2")
    missed = _events(snaps.catch_up(view, start)[1])
    assert not missed[0].reset and missed[-1].revision == log.revision
    for i in range(3, 12):
        _bump(store, log, f"10.0.0.{i}")
    reset = _events(snaps.catch_up(view, start)[1])
    assert reset[0].reset and reset[-1].digest == view.digest


def test_a_records_op_is_encoded_once_and_shared() -> None:
    _, log, snaps = _setup()
    rec = next(iter(log.view("n1").records.values()))
    assert snaps.service_op(rec) is snaps.service_op(rec)
    assert snaps.service_op(rec) in snaps.snapshot_ops(log.view("n1"))
