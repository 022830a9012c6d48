"""ebpf composed with nft: one node agent, one node context, the one nft gets alone; the
members' refusals reported and retried by the agent as a single backend's."""

from __future__ import annotations

import http.client
import json
from collections.abc import Mapping
from typing import Any

import pytest

from svcproxy.backends.ebpf.compose import Composed
from svcproxy.backends.nft.backend import NftBackend
from svcproxy.model import NodeInfo, Protocol, ServicePort, ServicePortKey, ServicePortState
from svcproxy.sdk import Backend, Changes, Delta, NodeContext, NodeState, StagedBackend
from svcproxy.sdk.config import NodeConfig
from svcproxy.sdk.node_agent import NodeAgent
from svcproxy.sdk.refusals import Refusals
from svcproxy.sdk.testing import FakeSource
from tests.support.nft_fixtures import CONFIG
from tests.support.running_agent import running
from tests.support.waiting import wait_for


class Sockets(Backend):
    """Stands for the socket half (the ebpf backend declares no NodePort default)."""

    name = "ebpf"

    def sync(self, state: NodeState, changes: Changes) -> None:
        pass


def agent_context(backend: Backend, config: NodeConfig = CONFIG) -> NodeContext:
    agent = NodeAgent(FakeSource(), backend, config, health_check_node_ports=False)
    try:
        return agent.context(NodeInfo("node1"))
    finally:
        agent.close()


def test_composed_nft_gets_the_node_context_nft_gets_alone() -> None:
    alone = agent_context(NftBackend(CONFIG))
    composed = agent_context(Composed(Sockets(), NftBackend(CONFIG)))
    assert composed == alone
    # kube-proxy nftables' default: NodePorts on the primary node IPs, not every address.
    assert composed.family(4).node_port_ips == ("192.168.50.2",)
    assert composed.family(6).node_port_ips == ("fd00:50::2",)


def test_ebpf_alone_keeps_nodeports_on_every_address() -> None:
    assert Composed(Sockets()).node_port_default == "all"
    assert agent_context(Sockets()) == agent_context(Composed(Sockets()))


def test_members_that_disagree_are_refused_with_what_to_do() -> None:
    class Everywhere(Sockets):
        node_port_default = "all"

    with pytest.raises(ValueError, match="--nodeport-addresses"):
        _ = Composed(Everywhere(), NftBackend(CONFIG)).node_port_default


class Table(StagedBackend[int]):
    """A member whose dataplane (``table``) refuses the ports of ``broken`` service
    ports, as the nft or socket half does when the kernel refuses one."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name
        self.table: dict[ServicePortKey, int] = {}
        self.broken: set[ServicePortKey] = set()
        self.refusals = Refusals(name)
        self._records: Mapping[ServicePortKey, ServicePortState] = {}

    def render(self, state: NodeState, record: ServicePortState) -> int | None:
        return record.service.port

    def apply(self, delta: Delta[ServicePortKey, int]) -> Delta[ServicePortKey, int] | None:
        taken = {k: v for k, v in delta.set.items() if k not in self.broken}
        for key in delta.set:
            if key in taken:
                self.refusals.clear(key)
            else:
                self.refusals.refuse(key, self._records.get(key), "File exists")
        if delta.rebuild:
            self.table.clear()
        self.table.update(taken)
        for key in delta.removed:
            self.table.pop(key, None)
        return None if len(taken) == len(delta.set) else Delta(delta.rebuild, taken,
                                                               delta.removed)

    def sync(self, state: NodeState, changes: Changes) -> None:
        self._records = state.services
        super().sync(state, changes)


def _key(name: str) -> ServicePortKey:
    return ServicePortKey("default", name, "http", Protocol.TCP)


def _state(revision: int, *names: str) -> NodeState:
    return NodeState("node1", revision, NodeInfo("node1"), {
        _key(n): ServicePortState(ServicePort(_key(n), cluster_ips=(f"10.96.0.{i + 1}",),
                                              port=80)) for i, n in enumerate(names)})


def _get(port: int, path: str) -> str:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", path)
        return conn.getresponse().read().decode()
    finally:
        conn.close()


def test_the_agent_reports_and_retries_what_a_member_refuses() -> None:
    """/healthz lists the service port nft refused (named by its member), the refusal
    metrics count it, and it is retried on its backoff (1 s) with no change and no
    periodic resync (1 h away). Before, Composed exposed neither ``refusals`` nor
    ``retry_in``: nothing was reported and c waited for the periodic resync."""
    sockets, nft = Table("ebpf"), Table("nft")
    nft.broken.add(_key("c"))
    source = FakeSource()
    agent = NodeAgent(source, Composed(sockets, nft),
                      NodeConfig("node1", sync_period=3600.0, min_sync_period=0.0),
                      healthz_address=("127.0.0.1", 0), metrics_address=("127.0.0.1", 0),
                      health_check_node_ports=False, poll=0.02)
    assert agent.healthz is not None and agent.metrics_server is not None
    healthz, metrics = agent.healthz.port, agent.metrics_server.port

    def refused() -> dict[str, Any] | None:
        return json.loads(_get(healthz, "/healthz")).get("refusedServicePorts")

    with running(agent):
        source.push(_state(1, "a", "b", "c"))
        wait_for(lambda: refused() is not None)
        assert refused() == {"count": 1, "servicePorts": [
            {"servicePort": "default/c:http/TCP", "error": "nft: File exists"}]}
        assert set(sockets.table) == {_key("a"), _key("b"), _key("c")}
        text = _get(metrics, "/metrics")
        assert 'svcproxy_backend_refused_services{backend="ebpf+nft"} 1.0' in text, text
        assert 'svcproxy_backend_refusals_total{backend="ebpf+nft"} 1.0' in text, text
        nft.broken.clear()  # what the kernel refused is fixed; c itself does not change
        wait_for(lambda: _key("c") in nft.table)
        wait_for(lambda: refused() is None)
        text = _get(metrics, "/metrics")
        assert 'svcproxy_backend_refused_services{backend="ebpf+nft"} 0.0' in text, text


def test_both_members_refusing_one_port_are_both_named_and_the_earliest_retry_wins(
        ) -> None:
    now = [0.0]
    sockets, nft = Table("ebpf"), Table("nft")
    for member in (sockets, nft):
        member.refusals = Refusals(member.name, clock=lambda: now[0])
        member.broken.add(_key("c"))
    composed = Composed(sockets, nft)
    assert composed.retry_in() is None and not composed.refusals
    state = _state(1, "c")
    composed.sync(state, Changes(frozenset(state.services), True, True, "initial"))
    assert composed.refusals.errors() == {_key("c"): "ebpf: File exists; nft: File exists"}
    assert composed.refusals.total == 2 and composed.retry_in() == 1.0
    sockets.broken.clear()
    now[0] = 1.0
    composed.sync(state, Changes(frozenset(), reason="refused"))  # both due: ebpf takes it
    assert composed.refusals.errors() == {_key("c"): "nft: File exists"}
    assert composed.retry_in() == 2.0, "nft's backoff doubled"
