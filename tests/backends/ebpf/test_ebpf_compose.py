"""ebpf composed with nft: one node agent, one node context, the one nft gets alone."""

from __future__ import annotations

import pytest

from svcproxy.backends.ebpf.compose import Composed
from svcproxy.backends.nft.backend import NftBackend
from svcproxy.model import NodeInfo
from svcproxy.sdk import Backend, Changes, NodeContext, NodeState
from svcproxy.sdk.config import NodeConfig
from svcproxy.sdk.node_agent import NodeAgent
from svcproxy.sdk.testing import FakeSource
from tests.support.nft_fixtures import CONFIG


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
