"""The computation alone: each service's records per node, from the store."""

from __future__ import annotations

from svcproxy.frontend.computation.records import ServiceRecords
from svcproxy.frontend.sources.events import Delete, Upsert
from svcproxy.frontend.store.store import Store
from tests.support.objects import KEY, endpoint, node, service, slice_

WEB = ("default", "web")


def _store(*events: Upsert) -> Store:
    store = Store()
    store.apply(events)
    return store


def test_a_node_gets_the_computed_records_with_its_own_endpoints_marked_local() -> None:
    store = _store(Upsert("Node", node("n1")), Upsert("Service", service("web")),
                   Upsert("EndpointSlice", slice_("web-1", "web", [endpoint("10.0.0.1", "n1"),
                                                                   endpoint("10.0.0.2", "n2")])))
    records = ServiceRecords(store)
    records.keep(WEB, records.compute(WEB))
    assert records.port_keys(WEB) == {KEY}
    mine = records.node_records("n1")[KEY]
    assert set(mine.endpoints) == {"10.0.0.1", "10.0.0.2"}
    assert mine.endpoints["10.0.0.1"].is_local and not mine.endpoints["10.0.0.2"].is_local


def test_a_service_with_no_ports_left_is_dropped() -> None:
    store = _store(Upsert("Service", service("web")))
    records = ServiceRecords(store)
    records.keep(WEB, records.compute(WEB))
    store.apply([Delete("Service", "default", "web")])
    records.keep(WEB, records.compute(WEB))
    assert records.port_keys(WEB) == set() and records.node_records("n1") == {}


def test_services_changed_before_sync_are_computed_once_at_sync() -> None:
    store = _store(Upsert("Service", service("web")), Upsert("Service", service("api")))
    records = ServiceRecords(store, proxy_name="")
    records.defer([WEB, ("default", "api")])
    assert not records.caches
    records.compute_deferred()
    assert set(records.caches) == {WEB, ("default", "api")}
    assert {k.name for k in records.node_records("n1")} == {"web", "api"}
    cache = records.caches[WEB]
    records.compute_deferred()
    assert records.caches[WEB] is cache


def test_a_node_named_by_no_service_gets_its_zones_shared_records() -> None:
    store = _store(Upsert("Node", node("n1", "z1")), Upsert("Node", node("n2", "z1")),
                   Upsert("Service", service("web")),
                   Upsert("EndpointSlice", slice_("web-1", "web", [endpoint("10.0.0.1", "n1")])))
    records = ServiceRecords(store)
    records.keep(WEB, records.compute(WEB))
    shared = records.shared("z1")
    assert records.node_records("n2") == shared and list(records.own("n2")) == []
    assert [set(r) for r in records.own("n1")] == [{KEY}]
    assert records.shared("z1") is shared
    records.keep(WEB, records.compute(WEB))
    assert records.shared("z1") is not shared
