"""The ipvs backend when the kernel refuses one service port's virtual server.

No IPVS on this kernel: the IPVS socket is a stand-in that keeps virtual servers
and refuses to create one address (as a kernel without the scheduler asked for
would, ENOENT); ipsets and iptables are recorded (tests/support/ipvs/standin.py). What is
checked is the backend's part: the other service ports are programmed, the refused
one is withdrawn whole (nothing half-created stays), reported, and retried only when
it changes.
"""

from __future__ import annotations

import errno
from collections.abc import Iterator, Sequence

import pytest

from svcproxy.backends.ipvs.backend import IpvsBackend, SyncError
from svcproxy.backends.ipvs.netlink import Failure, Request
from svcproxy.backends.ipvs.options import IpvsOptions
from svcproxy.model import Endpoint, Protocol, ServicePort, ServicePortKey, ServicePortState
from svcproxy.sdk import Changes, NodeState
from svcproxy.sdk.config import NodeConfig
from tests.support.ipvs.standin import StandInIpvs, stand_in

CONFIG = NodeConfig("node1", cluster_cidrs=("10.244.0.0/16",), node_ips=("10.100.0.1",))
REFUSED = "10.96.0.3"


@pytest.fixture
def backend(monkeypatch: pytest.MonkeyPatch) -> Iterator[IpvsBackend]:
    b = IpvsBackend(CONFIG, IpvsOptions(), families=(4,))
    stand_in(b, monkeypatch, StandInIpvs(refuse={REFUSED}))
    yield b


def key(name: str) -> ServicePortKey:
    return ServicePortKey("ns", name, "http", Protocol.TCP)


def state(c_pod: str = "10.244.1.30", c_ip: str = REFUSED) -> NodeState:
    records = []
    for name, cip, pod in (("a", "10.96.0.1", "10.244.1.10"), ("b", "10.96.0.2", "10.244.1.20"),
                           ("c", c_ip, c_pod)):
        svc = ServicePort(key(name), cluster_ips=(cip,), port=80, has_endpoints=True)
        records.append(ServicePortState(svc, {pod: Endpoint(pod, 8080, internal=True,
                                                            external=True)}))
    return NodeState("node1", 1, None, {r.key: r for r in records})


def addresses(b: IpvsBackend) -> set[str]:
    return {sid.address for sid in b.ipvs.servers}  # type: ignore[union-attr]


def test_the_others_are_programmed_and_the_refused_one_withdrawn(backend: IpvsBackend) -> None:
    first = state()
    backend.sync(first, Changes(frozenset(first.services), full=True, reason="initial"))
    assert addresses(backend) == {"10.96.0.1", "10.96.0.2"}
    assert list(backend.refusals) == [key("c")]
    assert "No such file or directory" in backend.refusals[key("c")].error
    assert not any(REFUSED in address for address in backend.desired.addresses)

    # Not retried while unchanged: a later change of another port sends nothing for c.
    ipvs = backend.ipvs
    assert isinstance(ipvs, StandInIpvs)
    ipvs.sent.clear()
    backend.sync(first, Changes(frozenset({key("a")})))
    assert not [r for r in ipvs.sent if REFUSED in r.what]

    # A new version of c is tried: at another address it is programmed.
    moved = state(c_ip="10.96.0.4")
    backend.sync(moved, Changes(frozenset({key("c")})))
    assert addresses(backend) == {"10.96.0.1", "10.96.0.2", "10.96.0.4"}
    assert not backend.refusals


def test_a_failure_that_is_nobodys_still_fails_the_sync(
        backend: IpvsBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse_all(requests: Sequence[Request]) -> list[Failure]:
        return [Failure(r, errno.EPERM) for r in requests]

    monkeypatch.setattr(backend.route, "apply", refuse_all)  # binding addresses fails
    first = state(c_ip="10.96.0.4")
    with pytest.raises(SyncError):
        backend.sync(first, Changes(frozenset(first.services), full=True, reason="initial"))
    assert not backend.refusals
