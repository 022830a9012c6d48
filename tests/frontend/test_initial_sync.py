"""The frontend's first state at sync: each service computed once, each node class once
when a view first needs it, every view equal to what publishing change by change gives,
digests equal to the records."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from svcproxy.frontend.computation import compute
from svcproxy.frontend.computation import records as records_module
from svcproxy.frontend.pipeline.engine import Engine
from svcproxy.frontend.runtime import metrics
from svcproxy.frontend.sources.events import Replace

NODES = [{"metadata": {"name": f"n{i}", "labels": {"topology.kubernetes.io/zone": f"z{i % 3}"}}}
         for i in range(10)]


def cluster(count: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    services, slices = [], []
    for i in range(count):
        spec: dict[str, Any] = {"clusterIP": f"10.96.0.{i + 1}",
                                "ports": [{"name": "p", "port": 80}, {"name": "q", "port": 81}]}
        if i % 3 == 0:
            spec |= {"type": "NodePort", "externalTrafficPolicy": "Local"}
        services.append({"metadata": {"name": f"s{i}", "namespace": "b"}, "spec": spec})
        eps = []
        for e in range(i % 4):
            n = (i + 3 * e) % 10
            ep: dict[str, Any] = {"addresses": [f"10.128.{i}.{e + 1}"], "nodeName": f"n{n}",
                                  "zone": f"z{n % 3}", "conditions": {"ready": e != 2}}
            if i % 2:
                ep["hints"] = {"forZones": [{"name": f"z{n % 3}"}]}
            eps.append(ep)
        slices.append({"metadata": {"name": f"s{i}-a", "namespace": "b",
                                    "labels": {"kubernetes.io/service-name": f"s{i}"}},
                       "addressType": "IPv4", "endpoints": eps,
                       "ports": [{"name": "p", "port": 8080, "protocol": "TCP"},
                                 {"name": "q", "port": 8081, "protocol": "TCP"}]})
    return services, slices


def cold_start(services: list[dict[str, Any]], slices: list[dict[str, Any]]) -> Engine:
    """Listed as the apiserver source does: Nodes first, one kind per batch."""
    eng = Engine()
    for kind, objs in (("Node", NODES), ("Service", services), ("EndpointSlice", slices)):
        eng.submit([Replace(kind, objs)])  # type: ignore[arg-type]
    assert eng.synced.is_set()
    return eng


def timeless(records: dict[Any, Any]) -> dict[Any, Any]:
    return {k: (replace(r.service, trigger_time=0.0), r.endpoints) for k, r in records.items()}


def test_every_view_at_sync_equals_publishing_change_by_change() -> None:
    services, slices = cluster(40)
    eng = cold_start(services, slices)
    live = Engine()
    live.submit([Replace("Node", []), Replace("Service", []),  # type: ignore[arg-type]
                 Replace("EndpointSlice", [])])
    names = [""] + [n["metadata"]["name"] for n in NODES]
    for name in names:  # watched from before the listing on the live engine
        live.changelog.view(name)
    assert eng.changelog.views == {}
    for kind, objs in (("Node", NODES), ("Service", services), ("EndpointSlice", slices)):
        live.submit([Replace(kind, objs)])  # type: ignore[arg-type]
    for name in names:
        view = eng.changelog.view(name)
        assert timeless(view.records) == timeless(live.changelog.views[name].records), name
        assert len(view.records) == 80
        assert view.digest == eng.changelog.digests.of(view), name


def test_no_service_is_computed_per_view_before_a_view_is_asked_for(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    calls = []
    real = compute.NodeClassCache.records

    def counted(self: compute.NodeClassCache, node_name: str, zone: str) -> Any:
        calls.append(node_name)
        return real(self, node_name, zone)

    monkeypatch.setattr(compute.NodeClassCache, "records", counted)
    services, slices = cluster(40)
    eng = cold_start(services, slices)
    assert calls == []
    for name in [""] + [n["metadata"]["name"] for n in NODES]:
        eng.changelog.view(name)
    # One call per zone (3 and the cluster view's) and per node hosting endpoints: at
    # most 4 + 3 per service, where computing every view would be 11 per listing.
    assert 0 < len(calls) <= 7 * 40


def test_a_service_failing_at_sync_is_left_out_alone(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    real = records_module.service_base

    def broken(svc: Any, *args: Any, **kwargs: Any) -> Any:
        if svc is not None and svc.name == "s5":
            raise RuntimeError("boom")
        return real(svc, *args, **kwargs)

    monkeypatch.setattr(records_module, "service_base", broken)
    errors = metrics.SERVICE_ERRORS._value.get()
    services, slices = cluster(12)
    eng = cold_start(services, slices)
    assert metrics.SERVICE_ERRORS._value.get() == errors + 1
    for name in [n["metadata"]["name"] for n in NODES] + [""]:
        view = eng.changelog.view(name)
        names = {k.name for k in view.records}
        assert "s5" not in names and len(names) == 11
        assert view.digest == eng.changelog.digests.of(view)
    monkeypatch.setattr(records_module, "service_base", real)
    services[5]["spec"]["ports"][0]["port"] = 8000
    eng.submit([Replace("Service", services)])  # type: ignore[arg-type]
    assert all(any(k.name == "s5" for k in v.records) for v in eng.changelog.views.values())


def in_parts(kind: str, objs: list[dict[str, Any]], size: int) -> list[Replace]:
    parts = [objs[i:i + size] for i in range(0, len(objs), size)] or [[]]
    return [Replace(kind, part, first=i == 0, last=i == len(parts) - 1)  # type: ignore[arg-type]
            for i, part in enumerate(parts)]


def test_services_are_computed_between_pages_as_at_sync(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Pages of both kinds interleaved, a service's slices split over pages and changed
    after it was computed, objects left out of the listing: the services settled between
    pages are computed then, and every view equals the one-batch sync's."""
    computed: list[Any] = []
    real = records_module.service_base

    def counted(svc: Any, *args: Any, **kwargs: Any) -> Any:
        computed.append(svc.name if svc is not None else None)
        return real(svc, *args, **kwargs)

    services, slices = cluster(40)
    extra = [{"metadata": {"name": f"s{i}-b", "namespace": "b",
                           "labels": {"kubernetes.io/service-name": f"s{i}"}},
              "addressType": "IPv4", "ports": [{"name": "p", "port": 9090, "protocol": "TCP"}],
              "endpoints": [{"addresses": [f"10.129.0.{i + 1}"], "nodeName": "n1"}]}
             for i in range(0, 40, 7)]
    gone = {"metadata": {"name": "gone", "namespace": "b"},
            "spec": {"clusterIP": "10.96.1.1", "ports": [{"port": 80}]}}
    reference = cold_start(services, slices + extra)
    monkeypatch.setattr(records_module, "service_base", counted)
    eng = Engine()
    eng.submit([Replace("Node", NODES)])  # type: ignore[arg-type]
    eng.submit([Replace("Service", [gone], first=True, last=False)])  # type: ignore[arg-type]
    svc_parts = in_parts("Service", services, 7)
    slice_parts = in_parts("EndpointSlice", slices + extra, 6)
    for i in range(max(len(svc_parts), len(slice_parts))):
        for parts in (slice_parts, svc_parts):
            if i < len(parts):  # the Services' listing starts over: "gone" is left out
                eng.submit([parts[i]])
        if not eng.synced.is_set():
            before_sync = len(computed)
    assert eng.synced.is_set()
    assert 0 < before_sync < len(computed)  # some computed between pages, the rest at sync
    assert len(computed) < 2 * 40
    for name in [""] + [n["metadata"]["name"] for n in NODES]:
        view = eng.changelog.view(name)
        assert timeless(view.records) == timeless(reference.changelog.view(name).records), name
        assert view.digest == eng.changelog.digests.of(view), name
    assert "gone" not in {k.name for k in eng.changelog.view("").records}
