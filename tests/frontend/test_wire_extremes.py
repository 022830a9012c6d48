"""End to end: while objects holding every extreme value exist (trigger times at each end
of what Go parses and just past it, strings of every width of code point and near the
annotations' full size, ports and timeouts at Kubernetes' bounds), a real Watch over gRPC and real
SDK clients stay connected, the extreme values arrive as the converters say, and another
node keeps receiving every change."""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from svcproxy.frontend.sources.events import Upsert
from svcproxy.sdk.client import NodeStateClient
from svcproxy.wirevalues import LATEST
from tests.support.examples import copy_examples
from tests.support.objects import endpoint, service, slice_
from tests.support.waiting import wait_for

# An annotation value -> the trigger time the SDK gets (0.0: none, so the time the
# frontend saw the slice, as for a slice without the annotation).
TRIGGERS = {
    "9999-12-31T23:59:59.999999999Z": LATEST,
    "9999-12-31T23:59:59-23:59": 0.0,  # past year 9999 once in UTC: the known bug
    "9999-12-31T23:59:59-00:01": 0.0,
    "0001-01-01T00:00:00Z": 0.0,  # before 1970: no trigger time (kube-proxy's metric too)
    "0001-01-01T00:00:00+23:59": 0.0,
    "0000-01-01T00:00:00Z": 0.0,
    "2026-03-01T10:00:00.1234567891234+24:60": (
        datetime(2026, 3, 1, 10, tzinfo=UTC) - timedelta(hours=25)).timestamp() + 0.1234567,
    "2026-03-01T1:00:00,5Z": datetime(2026, 3, 1, 1, tzinfo=UTC).timestamp() + 0.5,
    "2026-03-01T10:00:60Z": 0.0,
    "not a time \u0000\U0010ffff": 0.0,
}
OPTION = "svcproxy.io/note"
# ~200 KiB of UTF-8 from every width of code point (lone surrogates never come this far:
# intake refuses them, and the apiserver stores none; tests/test_wire_values.py has them).
LONG = "\x00\u00e9\uffff\U0010ffff" * (200 * 1024 // 10)


def extremes() -> list[Upsert]:
    out = []
    for i, trigger in enumerate(TRIGGERS):
        name = f"t{i}"
        svc = service(name, ip=f"10.96.1.{i + 1}", port=65535, target=65535,
                      type="NodePort", sessionAffinity="ClientIP",
                      sessionAffinityConfig={"clientIP": {"timeoutSeconds": 86400}})
        svc["spec"]["ports"][0]["nodePort"] = 30000 + i
        svc["metadata"]["annotations"] = {OPTION: LONG if i == 0 else f"\U0001f600{i}"}
        eps = slice_(f"{name}-x", name, [endpoint(f"10.1.1.{i + 1}", node="node-a")],
                     port=65535)
        eps["metadata"]["annotations"] = {
            "endpoints.kubernetes.io/last-change-trigger-time": trigger}
        out += [Upsert("Service", svc), Upsert("EndpointSlice", eps)]
    return out


def web(version: int) -> list[Upsert]:
    return [Upsert("Service", service("probe", ip="10.96.2.1", target=8080)),
            Upsert("EndpointSlice", slice_("probe-x", "probe", [
                endpoint(f"10.2.0.{version}", node="node-b")]))]


def probe_ips(client: NodeStateClient, last: dict[str, Any]) -> set[str]:
    """The probe's endpoints in the client's state (kept in ``last``) if it changed."""
    taken = client.take()
    if taken is None:
        return set()
    last["state"] = taken[0]
    return {ip for key, rec in taken[0].services.items() if key.name == "probe"
            for ip in rec.endpoints}


@pytest.fixture
def clients(frontend_factory: Any, tmp_path: Any) -> Any:
    fe = frontend_factory(copy_examples(tmp_path))
    out = [NodeStateClient(fe.opts.listen, name) for name in ("node-a", "node-b")]
    for client in out:
        client.start()
    try:
        yield fe, out
    finally:
        for client in out:
            client.stop()


def test_extreme_values_stop_no_stream(clients: Any, caplog: pytest.LogCaptureFixture) -> None:
    fe, (node_a, node_b) = clients
    caplog.set_level(logging.WARNING, logger="svcproxy.sdk")
    seen = time.time()
    fe.submit(extremes())
    last: dict[str, Any] = {}
    for version in (1, 2, 3):  # changes keep reaching both nodes meanwhile
        fe.submit(web(version))
        for client in (node_a, node_b):
            wait_for(lambda c=client, v=version: probe_ips(c, last) == {f"10.2.0.{v}"},
                     timeout=20)
    services = {k.name: rec.service for k, rec in last["state"].services.items()}
    for i, want in enumerate(TRIGGERS.values()):
        svc = services[f"t{i}"]
        if want:
            assert svc.trigger_time == pytest.approx(want, abs=1e-6)
        else:  # the field degraded: when the frontend saw the slice
            assert seen - 1 <= svc.trigger_time <= time.time() + 1
        assert (svc.port, svc.node_port, svc.session_affinity_timeout) == (
            65535, 30000 + i, 86400)
    assert dict(services["t0"].options)[OPTION] == LONG
    assert dict(services["t1"].options)[OPTION] == "\U0001f6001"
    assert node_a.connected and node_b.connected
    assert not [r for r in caplog.records if "failed" in r.getMessage()], \
        "a stream ended: " + "; ".join(r.getMessage() for r in caplog.records)


def test_an_op_the_sdk_cannot_apply_is_named_and_counted(
        frontend_factory: Any, tmp_path: Any, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """No value the wire carries fails the SDK's decoder; should anything else fail one
    op (a decoder bug), the watch's warning names the node, the object and what failed,
    the op is counted, and the client resumes once it can apply it."""
    from svcproxy.sdk import client as sdk_client

    decode = sdk_client.state_from_pb

    def failing(msg: Any) -> Any:
        if msg.service.key.name == "probe":
            raise ValueError("field trigger_time: not valid")
        return decode(msg)

    fe = frontend_factory(copy_examples(tmp_path))
    client = NodeStateClient(fe.opts.listen, "node-a", max_backoff=0.2)
    counted: list[str] = []
    client.on_undecodable = counted.append  # the node agent's metric
    monkeypatch.setattr(sdk_client, "state_from_pb", failing)
    client.start()
    try:
        fe.submit(web(1))
        wait_for(lambda: client.undecodable >= 1, timeout=20)
        assert counted[0] == "node-a"
        warnings = [r.getMessage() for r in caplog.records
                    if r.name == "svcproxy.sdk.client" and r.levelno == logging.WARNING]
        assert any("watch of node-a" in m and "replace_service of default/probe:http/tcp" in m
                   and "trigger_time" in m for m in warnings), warnings
        monkeypatch.setattr(sdk_client, "state_from_pb", decode)
        last: dict[str, Any] = {}
        wait_for(lambda: probe_ips(client, last) == {"10.2.0.1"}, timeout=20)
    finally:
        client.stop()


# Every other wire field at its extreme: names as long as Kubernetes allows, the widest
# addresses and ranges, ports at both ends, every condition, the most hints of the
# longest names, zones of every width of code point, a thousand endpoints, the node's
# own fields.
NS, NAME, PORT_NAME = "n" * 63, "w" + "x" * 62, "p" * 63  # DNS-1123/1035 labels
NODE_NAME = ".".join(["a" * 63] * 3 + ["b" * 61])  # a 253-character subdomain
ZONE = "\x00\u00e9\uffff\U0010ffff" * 250
V6 = "2001:db8:ffff:ffff:ffff:ffff:ffff:"
RANGES = ("0.0.0.0/0", "::/0", "::ffff:10.0.0.0/104", V6 + "ffff/128")
HINT_ZONES = tuple(f"{i}{'Z' * 62}" for i in range(8))
HINT_NODES = tuple(f"{i}{NODE_NAME[1:]}" for i in range(8))


def widest() -> list[Upsert]:
    node_a = {"kind": "Node", "metadata": {"name": "node-a", "labels": {
        "topology.kubernetes.io/zone": "Z" * 63, "kubernetes.io/hostname": "node-a",
        "example.com/" + "k" * 63: ""}},
        "spec": {"podCIDRs": ["10.244.1.0/24", V6 + "0/112"]},
        "status": {"addresses": [{"type": "InternalIP", "address": "192.168.10.11"},
                                 {"type": "InternalIP", "address": V6 + "fffe"}]}}
    svc = service(NAME, ns=NS, ip="10.96.3.1", port=1, target="a" * 15, type="LoadBalancer",
                  clusterIPs=["10.96.3.1", V6 + "fff0"], ipFamilyPolicy="RequireDualStack",
                  externalIPs=["255.255.255.254", V6 + "fffd"], externalTrafficPolicy="Local",
                  healthCheckNodePort=65534, sessionAffinity="ClientIP",
                  sessionAffinityConfig={"clientIP": {"timeoutSeconds": 1}},
                  loadBalancerSourceRanges=list(RANGES), trafficDistribution="PreferSameNode")
    svc["spec"]["ports"] = [
        {"name": PORT_NAME, "port": 1, "targetPort": "a" * 15, "nodePort": 65535},
        {"name": "s", "port": 65535, "protocol": "SCTP", "targetPort": 65535, "nodePort": 1}]
    svc["metadata"]["annotations"] = {"svcproxy.io/" + "o" * 63: ""}
    svc["status"] = {"loadBalancer": {"ingress": [{"ip": V6 + "fffc", "ipMode": "Proxy"},
                                                  {"ip": "203.0.113.255", "ipMode": "VIP"}]}}
    hinted = {"addresses": [V6 + "1"], "nodeName": NODE_NAME, "zone": ZONE,
              "hostname": "h" * 63, "conditions": {"ready": False, "serving": True,
                                                   "terminating": True},
              "hints": {"forZones": [{"name": z} for z in HINT_ZONES],
                        "forNodes": [{"name": n} for n in HINT_NODES]}}
    v6 = slice_(f"{NAME}-6", NAME, [hinted], ns=NS, port=65535, family="IPv6",
                port_name=PORT_NAME)
    v4 = slice_(f"{NAME}-4", NAME, [endpoint(f"10.4.{i // 250}.{i % 250 + 1}", node="node-a")
                                    for i in range(1000)], ns=NS, port=1, port_name=PORT_NAME)
    return [Upsert("Node", node_a), Upsert("Service", svc), Upsert("EndpointSlice", v6),
            Upsert("EndpointSlice", v4)]


def test_the_widest_names_addresses_and_counts_stop_no_stream(
        clients: Any, caplog: pytest.LogCaptureFixture) -> None:
    fe, (node_a, node_b) = clients
    caplog.set_level(logging.WARNING, logger="svcproxy.sdk")
    fe.submit(widest())
    last: dict[str, Any] = {}
    for version in (1, 2, 3):  # changes keep reaching both nodes meanwhile
        fe.submit(web(version))
        for client in (node_a, node_b):
            wait_for(lambda c=client, v=version: probe_ips(c, last) == {f"10.2.0.{v}"},
                     timeout=20)
    state = node_a.take() or (last["state"], None)
    mine = {key: rec for key, rec in state[0].services.items() if key.name == NAME}
    by_port = {key.port_name: rec for key, rec in mine.items()}
    first = by_port[PORT_NAME]
    svc = first.service
    assert (svc.key.namespace, svc.port, svc.node_port, svc.health_check_node_port,
            svc.session_affinity_timeout) == (NS, 1, 65535, 65534, 1)
    assert set(svc.load_balancer_source_ranges) == {"0.0.0.0/0", "::/0", "10.0.0.0/8",
                                                    V6 + "ffff/128"}
    assert {(i.ip, i.ip_mode) for i in svc.load_balancer_ingress} == {
        (V6 + "fffc", "Proxy"), ("203.0.113.255", "VIP")}
    assert svc.options == (("svcproxy.io/" + "o" * 63, ""),)
    assert len([ip for ip in first.endpoints if "." in ip]) == 1000
    ep = first.endpoints[V6 + "1"]
    assert (ep.port, ep.node_name, ep.zone, ep.hint_zones, ep.hint_nodes) == (
        65535, NODE_NAME, ZONE, HINT_ZONES, HINT_NODES)
    assert (ep.ready, ep.serving, ep.terminating) == (False, True, True)
    assert by_port["s"].service.port == 65535 and by_port["s"].service.node_port == 1
    node = state[0].node
    assert node is not None and node.zone == "Z" * 63 and V6 + "0/112" in node.pod_cidrs
    assert node_a.connected and node_b.connected
    assert not [r for r in caplog.records if "failed" in r.getMessage()], \
        "a stream ended: " + "; ".join(r.getMessage() for r in caplog.records)
