"""The iptables backend when the kernel refuses one service port: the rest is applied.

Real kernel (iptables-nft), a namespace per test. The refusal is genuine: the test
creates, with nft, a base chain in the ``ip nat`` table named as service c's KUBE-SVC
chain; the kernel then refuses to create that chain ("File exists") and to jump to a
base chain ("Operation not supported"), in every transaction that writes c.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from svcproxy.backends.iptables import names
from svcproxy.backends.iptables.backend import IptablesBackend, IptablesOptions
from svcproxy.model import Endpoint, Protocol, ServicePort, ServicePortKey, ServicePortState
from svcproxy.sdk import Changes, NodeState
from svcproxy.sdk.config import NodeConfig
from tests.support.lab.netns import ns_exec
from tests.support.netns.harness import netns_or_skip

pytestmark = pytest.mark.netns
CONFIG = NodeConfig("node1", cluster_cidrs=("10.244.0.0/16",), node_ips=("192.168.50.2",))


def key(name: str) -> ServicePortKey:
    return ServicePortKey("default", name, "http", Protocol.TCP)


@pytest.fixture
def netns() -> Iterator[str]:
    with netns_or_skip("spiptref") as name:
        yield name


def record(name: str, cip: str, *pods: str) -> ServicePortState:
    svc = ServicePort(key(name), cluster_ips=(cip,), port=80, has_endpoints=bool(pods))
    eps = {ip: Endpoint(ip, 8080, internal=True, external=True, cluster=True) for ip in pods}
    return ServicePortState(svc, eps)


def state(b_pod: str = "10.244.1.20", c_pod: str = "10.244.1.30") -> NodeState:
    records = [record("a", "10.96.0.1", "10.244.1.10"), record("b", "10.96.0.2", b_pod),
               record("c", "10.96.0.3", c_pod)]
    return NodeState("node1", 1, None, {r.key: r for r in records})


def c_chain() -> str:
    return names.SVC_PREFIX + names.service_hash(key("c"))


def test_one_refused_service_leaves_the_others_programmed(netns: str) -> None:
    ns_exec(netns, "iptables-nft", "-t", "nat", "-N", "SETUP")  # makes the ip nat table
    ns_exec(netns, "nft", "add", "chain", "ip", "nat", c_chain(),
        "{ type nat hook output priority 5; }")
    b = IptablesBackend(CONFIG, IptablesOptions(
        mode="nft", families=(4,), localhost_nodeports=False, prefix=("ip", "netns", "exec",
                                                                       netns)))
    first = state()
    b.sync(first, Changes(frozenset(first.services), full=True, reason="initial"))
    assert list(b.refusals) == [key("c")]
    error = b.refusals[key("c")].error
    assert "File exists" in error or "Operation not supported" in error
    nat = ns_exec(netns, "iptables-nft-save", "-t", "nat")
    for name, cip, pod in (("a", "10.96.0.1", "10.244.1.10"), ("b", "10.96.0.2", "10.244.1.20")):
        assert f"-A KUBE-SERVICES -d {cip}/32" in nat
        assert f"-j {names.SVC_PREFIX}{names.service_hash(key(name))}" in nat
        assert f"--to-destination {pod}:8080" in nat
    assert "10.96.0.3" not in nat and "10.244.1.30" not in nat  # nothing half-written of c

    # A change of b is applied (partially), c stays refused and is not tried again.
    second = state(b_pod="10.244.1.21")
    b.sync(second, Changes(frozenset({key("b")})))
    nat = ns_exec(netns, "iptables-nft-save", "-t", "nat")
    assert "--to-destination 10.244.1.21:8080" in nat and "10.96.0.3" not in nat
    assert list(b.refusals) == [key("c")] and b.last_sync_full is False

    # The conflict goes; a new version of c is tried and programmed.
    ns_exec(netns, "nft", "delete", "chain", "ip", "nat", c_chain())
    third = state(b_pod="10.244.1.21", c_pod="10.244.1.31")
    b.sync(third, Changes(frozenset({key("c")})))
    assert not b.refusals
    nat = ns_exec(netns, "iptables-nft-save", "-t", "nat")
    assert "-A KUBE-SERVICES -d 10.96.0.3/32" in nat and "10.244.1.31:8080" in nat
