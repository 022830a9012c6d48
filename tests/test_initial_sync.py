"""The frontend's first state at sync: each service computed once, each node class once
when a view first needs it, every view equal to what publishing change by change gives,
digests equal to the records."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from svcproxy.frontend import metrics
from svcproxy.frontend.computation import compute
from svcproxy.frontend.computation import records as records_module
from svcproxy.frontend.engine import Engine
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
