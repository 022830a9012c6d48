"""The store alone: objects kept as received, what each batch touched, refusals alone."""

from __future__ import annotations

import json

import pytest

from svcproxy.frontend.edge.objects import EndpointSlice
from svcproxy.frontend.intake.intake import Intake
from svcproxy.frontend.runtime import metrics
from svcproxy.frontend.sources.events import Delete, RawObject, Replace, Upsert
from svcproxy.frontend.store.store import Store
from tests.support.objects import endpoint, node, service, slice_

WEB = ("default", "web")


def test_a_change_touches_its_service_and_an_equal_object_touches_nothing() -> None:
    store = Store()
    touched = store.apply([Upsert("Service", service("web")),
                           Upsert("EndpointSlice", slice_("web-1", "web", [endpoint("10.0.0.1")]))])
    assert touched.services == {WEB} and not touched.nodes
    assert store.services[WEB].name == "web"
    assert [s.name for s in store.slices_for(WEB)] == ["web-1"]
    again = store.apply([Upsert("Service", service("web"))])
    assert not again.services and not again.nodes


def test_a_slice_moved_to_another_service_touches_both_and_leaves_the_old_one() -> None:
    store = Store()
    store.apply([Upsert("EndpointSlice", slice_("s-1", "web", [endpoint("10.0.0.1")]))])
    touched = store.apply([Upsert("EndpointSlice", slice_("s-1", "api", [endpoint("10.0.0.1")]))])
    assert touched.services == {WEB, ("default", "api")}
    assert list(store.slices_for(WEB)) == [] and WEB not in store.slices_of
    assert [s.name for s in store.slices_for(("default", "api"))] == ["s-1"]


def test_a_replace_drops_what_it_does_not_list_and_counts_as_listed() -> None:
    store = Store()
    store.apply([Upsert("Node", node("n1", "z1")), Upsert("Node", node("n2"))])
    assert not store.listed_all
    touched = store.apply([Replace("Node", [node("n1", "z2")]), Replace("Service", []),
                           Replace("EndpointSlice", [])])
    assert touched.nodes == {"n1", "n2"} and set(store.nodes) == {"n1"}
    assert store.zone("n1") == "z2" and store.zone("n2") == ""
    assert [n.name for n in store.known_nodes()] == ["n1"]
    assert store.listed_all
    assert store.apply([Delete("Node", "", "n1")]).nodes == {"n1"} and not store.nodes


def _refused(source: str) -> float:
    return sum(s.value for m in metrics.REJECTED_OBJECTS.collect() for s in m.samples
               if s.name.endswith("_total") and s.labels["source"] == source)


def test_an_invalid_object_is_refused_alone_and_counted() -> None:
    store = Store(Intake("store-test"))
    touched = store.apply([Upsert("Service", service("bad", ip="not-an-ip")),
                           Upsert("Service", service("web"))])
    assert touched.services == {WEB} and set(store.services) == {WEB}
    assert _refused("store-test") == 1


def test_a_listing_in_parts_applies_each_part_and_deletes_at_its_last() -> None:
    store = Store()
    store.apply([Replace("Service", [service("old"), service("web")])])
    store.apply([Replace("Service", [service("web")], first=True, last=False)])
    assert set(store.services) == {("default", "old"), WEB} and "Service" in store.listed
    touched = store.apply([Replace("Service", [service("api")], first=False, last=False)])
    assert touched.services == {("default", "api")} and ("default", "old") in store.services
    touched = store.apply([Replace("Service", [], first=False, last=True)])
    assert touched.services == {("default", "old")}
    assert set(store.services) == {WEB, ("default", "api")}


def test_a_listing_cut_short_is_forgotten_at_the_next_first_part() -> None:
    store = Store()
    store.apply([Replace("Node", [node("n1")], first=True, last=False)])
    assert "Node" not in store.listed
    store.apply([Replace("Node", [node("n2")], first=True, last=True)])
    assert set(store.nodes) == {"n2"} and "Node" in store.listed


def test_listed_raw_slices_are_kept_or_refused_as_their_dicts_are(
        caplog: pytest.LogCaptureFixture) -> None:
    trigger = {"endpoints.kubernetes.io/last-change-trigger-time": "2026-11-27T05:00:00Z"}
    good = slice_("web-1", "web", [endpoint("10.0.0.1"), endpoint("10.0.0.2", "n2")])
    odd = dict(slice_("web-2", "web", [endpoint("10.0.0.3")]), extra={"a": 1})
    good["metadata"]["annotations"] = odd["metadata"]["annotations"] = trigger
    bad = slice_("web-3", "web", [endpoint("127.0.0.1")])
    items = [good, odd, bad]
    raw = [RawObject("EndpointSlice", "discovery.k8s.io/v1", json.dumps(o).encode())
           for o in items] + [RawObject("EndpointSlice", "discovery.k8s.io/v1", b"1" * 5000)]
    assert isinstance(Intake().decode(raw[0]), EndpointSlice)  # the typed path
    assert isinstance(Intake().decode(raw[1]), dict)  # a field it does not know
    by_dicts, by_raw = Store(Intake("raw-a")), Store(Intake("raw-b"))
    by_dicts.apply([Replace("EndpointSlice", [*items, None])])  # type: ignore[list-item]
    lines = [r.getMessage().replace("raw-a", "raw") for r in caplog.records]
    caplog.clear()
    by_raw.apply([Replace("EndpointSlice", raw)])
    assert [r.getMessage().replace("raw-b", "raw") for r in caplog.records] == lines
    assert by_raw.slices == by_dicts.slices
    assert set(by_raw.slices) == {("default", "web-1"), ("default", "web-2")}
    assert _refused("raw-a") == _refused("raw-b") == 2
