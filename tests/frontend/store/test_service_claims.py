"""Two Services claiming one ClusterIP:port/protocol or nodePort/protocol: the later (by
creationTimestamp, then namespace/name) is refused for that port alone, logged and
counted, as the apiserver's allocators would have refused it; the holder's going serves
the next in line. Through manifests and through the stand-in apiserver."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import yaml

from svcproxy.frontend.intake.intake import Intake
from svcproxy.frontend.pipeline.engine import Engine
from svcproxy.frontend.runtime import metrics
from svcproxy.frontend.sources.events import Delete, Replace, Upsert
from svcproxy.frontend.sources.manifests import ManifestSource
from svcproxy.model import Protocol, ServicePortKey
from tests.support.hostile import endpoint_slice, node, service, set_path
from tests.support.waiting import wait_for


def refused(claim: str) -> float:
    return metrics.REFUSED_PORTS.labels(claim)._value.get()


def records(eng: Engine, node_name: str = "node-a") -> dict[ServicePortKey, Any]:
    return dict(eng.changelog.view(node_name).records)


def key(name: str, port: str = "http") -> ServicePortKey:
    return ServicePortKey("shop", name, port, Protocol.TCP)


def created(obj: dict[str, Any], when: str) -> dict[str, Any]:
    return set_path(obj, "metadata.creationTimestamp", when)


def write(directory: Path, name: str, *objs: dict[str, Any]) -> Path:
    path = directory / f"{name}.yaml"
    path.write_text(yaml.safe_dump_all(list(objs)))
    return path


def test_the_later_service_on_a_cluster_ip_port_is_refused_for_that_port_alone(
        tmp_path: Path, caplog) -> None:  # type: ignore[no-untyped-def]
    first = created(service("first", ip="10.96.0.10"), "2026-01-01T00:00:00Z")
    # The later one shares 10.96.0.10:80/TCP; its port 443 is its own.
    later = created(service("later", ip="10.96.0.10", ports=[
        {"name": "http", "port": 80}, {"name": "https", "port": 443}]),
        "2026-01-01T00:00:00+00:00")  # same time: namespace/name decides (first < later)
    eng = Engine()
    eng.store.intake = Intake("manifests")
    write(tmp_path, "a", first, endpoint_slice("first-1", "first"), node())
    holder_file = tmp_path / "a.yaml"
    write(tmp_path, "b", later, endpoint_slice("later-1", "later", ips=("10.244.1.9",)))
    source = ManifestSource(tmp_path, eng.submit, use_inotify=False)
    before = refused("cluster_ip")
    caplog.set_level(logging.INFO)
    source.load_all()
    served = records(eng)
    assert set(served[key("first")].endpoints) == {"10.244.1.5"}
    assert key("later") not in served, "10.96.0.10:80/TCP is first's"
    assert key("later", "https") in served, "the later Service's other port is served"
    assert refused("cluster_ip") - before == 1
    lines = [r.getMessage() for r in caplog.records if "refused port" in r.getMessage()]
    assert len(lines) == 1 and "shop/later" in lines[0] and "10.96.0.10:80/TCP" in lines[0] \
        and "shop/first" in lines[0], lines
    # An unrelated edit of the later Service's file says nothing new.
    source.apply([tmp_path / "b.yaml"], [])
    assert refused("cluster_ip") - before == 1
    # The holder goes: the next in line is served.
    holder_file.write_text(yaml.safe_dump_all([node()]))
    source.apply([holder_file], [])
    served = records(eng)
    assert key("first") not in served
    assert set(served[key("later")].endpoints) == {"10.244.1.9"}


def test_a_node_port_is_held_by_the_earliest_creation_time_whatever_the_names() -> None:
    def svc(name: str, ip: str, when: str) -> dict[str, Any]:
        return created(service(name, ip=ip, type="NodePort", ports=[
            {"name": "http", "port": 80, "nodePort": 30080},
            {"name": "dns", "port": 53, "protocol": "UDP", "nodePort": 30080}]), when)

    eng = Engine()
    eng.store.intake = Intake("manifests")
    before = refused("node_port")
    # "aaa" sorts first by name but was created later: "zzz" holds 30080/TCP and /UDP.
    eng.submit([Replace("Node", [node()]), Replace("EndpointSlice", []),
                Replace("Service", [svc("zzz", "10.96.0.20", "2026-01-01T00:00:00Z"),
                                    svc("aaa", "10.96.0.21", "2026-01-01T03:00:00+02:00")])])
    served = records(eng)
    assert key("zzz") in served and ServicePortKey("shop", "zzz", "dns", Protocol.UDP) in served
    assert key("aaa") not in served
    assert ServicePortKey("shop", "aaa", "dns", Protocol.UDP) not in served
    assert refused("node_port") - before == 2
    # The holder drops its node port for TCP: aaa's TCP port is served, its UDP one not.
    eng.submit([Upsert("Service", svc("zzz", "10.96.0.20", "2026-01-01T00:00:00Z") | {
        "spec": {**svc("zzz", "10.96.0.20", "")["spec"], "ports": [
            {"name": "dns", "port": 53, "protocol": "UDP", "nodePort": 30080}]}})])
    served = records(eng)
    assert key("aaa") in served and ServicePortKey("shop", "aaa", "dns", Protocol.UDP) \
        not in served
    eng.submit([Delete("Service", "shop", "zzz")])
    assert ServicePortKey("shop", "aaa", "dns", Protocol.UDP) in records(eng)


def test_services_without_a_conflict_are_untouched() -> None:
    """Same port on different cluster IPs, same cluster IP on different ports or
    protocols, headless Services: nothing is refused."""
    eng = Engine()
    eng.store.intake = Intake("manifests")
    before = refused("cluster_ip") + refused("node_port")
    eng.submit([Replace("Node", [node()]), Replace("EndpointSlice", []), Replace("Service", [
        service("a", ip="10.96.0.1"), service("b", ip="10.96.0.2"),
        service("c", ip="10.96.0.1", ports=[{"name": "http", "port": 81}]),
        service("d", ip="10.96.0.1", ports=[{"name": "http", "port": 80, "protocol": "UDP"}]),
        service("e", ip="None", clusterIPs=["None"]),
        service("f", ip="None", clusterIPs=["None"])])])
    assert {k.name for k in records(eng)} == {"a", "b", "c", "d"}
    assert refused("cluster_ip") + refused("node_port") == before


def test_the_stand_in_apiservers_allocator_and_the_manifests_agree(
        frontend_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The apiserver's allocator refuses the later Service (422, already allocated) and
    the frontend serves the earlier; the same objects from manifests end the same way
    (the later one's port refused, logged and counted)."""
    from tests.frontend.sources.test_apiserver_source import cluster_ip_service
    from tests.frontend.sources.test_apiserver_source import endpoint_slice as api_slice
    from tests.frontend.sources.test_apiserver_source import node as api_node
    from tests.support.fakeapiserver import FakeApiserver, write_kubeconfig

    objs = [api_node("n1"),
            created(cluster_ip_service("old", "10.96.0.10"), "2026-01-01T00:00:00Z"),
            created(cluster_ip_service("new", "10.96.0.10"), "2026-01-02T00:00:00Z"),
            api_slice("old-1", "old", ["10.0.0.1"]), api_slice("new-1", "new", ["10.0.0.2"])]
    kinds = ["Node", "Service", "Service", "EndpointSlice", "EndpointSlice"]
    old = ServicePortKey("default", "old", "http", Protocol.TCP)
    new = ServicePortKey("default", "new", "http", Protocol.TCP)
    api = FakeApiserver(token="t")
    try:
        codes = [api.submit(kind, obj) for kind, obj in zip(kinds, objs, strict=True)]
        assert [code for code, _ in codes] == [201, 201, 422, 201, 201]
        assert "already allocated" in codes[2][1]["message"]
        fe = frontend_factory(None, kubeconfig=str(write_kubeconfig(tmp_path / "kc", api.url,
                                                                    "t")))
        wait_for(lambda: old in fe.records("n1"), timeout=15)
        assert set(fe.records("n1")[old].endpoints) == {"10.0.0.1"}
        assert new not in fe.records("n1")
    finally:
        api.close()
    eng = Engine()
    eng.store.intake = Intake("manifests")
    write(tmp_path, "all", *[dict(o, kind=k, apiVersion="discovery.k8s.io/v1"
                                  if k == "EndpointSlice" else "v1")
                             for k, o in zip(kinds, objs, strict=True)])
    before = refused("cluster_ip")
    ManifestSource(tmp_path, eng.submit, use_inotify=False).load_all()
    served = records(eng, "n1")
    assert set(served[old].endpoints) == {"10.0.0.1"} and new not in served
    assert refused("cluster_ip") - before == 1
