"""The changelog alone: views, revisions, history, digests and listeners."""

from __future__ import annotations

import gc
import sys

from svcproxy.frontend.computation.records import ServiceRecords
from svcproxy.frontend.publication.changelog import Changelog
from svcproxy.frontend.publication.views import CLUSTER_VIEW
from svcproxy.frontend.sources.events import Event, Replace, Upsert
from svcproxy.frontend.store.store import Store
from svcproxy.v1 import nodestate_pb2 as pb
from tests.support.objects import KEY, endpoint, node, service, slice_


def _changelog() -> tuple[Store, Changelog]:
    store = Store()
    return store, Changelog(store, ServiceRecords(store), history_limit=100)


def _apply(store: Store, log: Changelog, *events: Event) -> None:
    log.publish(store.apply(events))


def _started() -> tuple[Store, Changelog]:
    store, log = _changelog()
    _apply(store, log, Replace("Node", [node("n1")]), Replace("Service", [service("web")]),
           Replace("EndpointSlice", [slice_("web-1", "web", [endpoint("10.0.0.1", "n1")])]))
    log.start()
    log.view("n1"), log.view(CLUSTER_VIEW)
    return store, log


def test_before_start_nothing_is_computed_and_start_fills_every_view_once() -> None:
    store, log = _changelog()
    _apply(store, log, Upsert("Node", node("n1")), Upsert("Service", service("web")))
    assert log.view("n1").records == {} and not log.records.caches
    log.start()
    assert log.views.keys() == {"n1"}
    for name in ("n1", CLUSTER_VIEW):
        view = log.view(name)
        assert set(view.records) == {KEY}
        assert view.history_start == view.revision == log.revision and not view.history
        assert view.digest == log.digests.of(view)


def test_a_view_is_made_when_first_asked_for_not_for_every_node() -> None:
    store, log = _changelog()
    nodes = [node(f"n{i}", f"z{i % 2}") for i in range(4)]
    _apply(store, log, Replace("Node", nodes), Replace("Service", [service("web")]),
           Replace("EndpointSlice", [slice_("web-1", "web", [endpoint("10.0.0.1", "n1")])]))
    log.start()
    assert log.views == {}
    before = log.revision
    mine, other = log.view("n1"), log.view("n2")
    assert log.revision == before + 2 and log.views.keys() == {"n1", "n2"}
    assert mine.records[KEY].endpoints["10.0.0.1"].is_local
    assert not other.records[KEY].endpoints["10.0.0.1"].is_local
    assert [v.digest for v in (mine, other)] == [log.digests.of(v) for v in (mine, other)]
    _apply(store, log, Upsert("EndpointSlice",
                              slice_("web-1", "web", [endpoint("10.0.0.2", "n2")])))
    assert log.views.keys() == {"n1", "n2"}
    assert log.view("n3").records == log.view("n1").records
    assert log.view("n2").records[KEY].endpoints["10.0.0.2"].is_local


def test_a_change_is_one_revision_of_the_views_it_changed_told_to_listeners() -> None:
    store, log = _started()
    heard: list[tuple[int, set[str]]] = []
    log.listeners.append(lambda rev, changed: heard.append((rev, set(changed))))
    before = log.revision
    _apply(store, log, Upsert("EndpointSlice",
                              slice_("web-1", "web", [endpoint("10.0.0.2", "n1")])))
    assert log.revision == before + 1 and heard == [(log.revision, {"n1", CLUSTER_VIEW})]
    view = log.views["n1"]
    rev, ops, _ = view.history[-1]
    assert rev == log.revision and ops
    assert {pb.Op.FromString(op.data).WhichOneof("op") for op in ops} <= {
        "set_endpoint", "delete_endpoint", "replace_service", "set_service"}
    assert set(view.records[KEY].endpoints) == {"10.0.0.2"}
    assert view.digest == log.digests.of(view)
    _apply(store, log, Upsert("Service", service("web")))
    assert log.revision == before + 1  # nothing changed: no revision


def test_a_view_made_again_after_release_cannot_be_resumed_from_its_old_revisions() -> None:
    _, log = _started()
    now = [0.0]
    log.clock = lambda: now[0]
    view = log.watch("n9")
    old = view.revision
    log.unwatch(view)
    now[0] = log.bounds.idle_seconds
    log.expire()
    assert "n9" not in log.views
    again = log.view("n9")
    assert again is not view and not again.can_resume(old)
    assert set(again.records) == {KEY} and again.digest == log.digests.of(again)


def test_a_node_change_is_published_to_its_view_and_the_clusters_with_their_digests() -> None:
    store, log = _started()
    _apply(store, log, Upsert("Node", node("n1", "z2")))
    for name in ("n1", CLUSTER_VIEW):
        view = log.views[name]
        ops = [pb.Op.FromString(op.data) for op in view.history[-1][1]]
        assert [op.set_node.zone for op in ops if op.WhichOneof("op") == "set_node"] == ["z2"]
        assert view.digest == log.digests.of(view)


def test_no_cyclic_collection_runs_while_a_view_is_made() -> None:
    store, log = _changelog()
    _apply(store, log, Replace("Node", [node("n1")]), Replace("Service", [
        service(f"web{i}", ip=f"10.96.0.{i + 1}") for i in range(50)]),
        Replace("EndpointSlice", [slice_(f"web{i}-1", f"web{i}", [
            endpoint(f"10.0.{i}.{e}", "n1") for e in range(5)]) for i in range(50)]))
    log.start()
    collections: list[bool] = []  # whether each ran while the view was being filled

    def seen(phase: str, info: dict[str, int]) -> None:
        frame = sys._getframe()
        while phase == "start" and frame is not None:
            if frame.f_code is Changelog._fill.__code__:
                collections.append(True)
            frame = frame.f_back
        collections.append(False)

    thresholds = gc.get_threshold()
    gc.set_threshold(1, 1, 1)  # a collection on nearly every allocation, but in a pause
    gc.callbacks.append(seen)
    try:
        view = log.view("n1")
    finally:
        gc.callbacks.remove(seen)
        gc.set_threshold(*thresholds)
    assert len(view.records) == 50 and collections and not any(collections)
