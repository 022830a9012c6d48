"""The lab's address plan (pure): who gets which IPv4/IPv6 address and route."""

from __future__ import annotations

from dataclasses import dataclass

LAN4, LAN6 = "192.168.50", "fd00:50:"
SERVICE_CIDRS = ("10.96.0.0/16", "fd00:96::/112")
CLUSTER_CIDRS = ("10.244.0.0/16", "fd00:244::/48")
# Where ExternalIPs and load-balancer IPs live; external clients route them to the entry node.
EXTERNAL_CIDRS = ("192.168.60.0/24", "fd00:60::/64")
SERVER_PORTS = (8080, 8081, 8082)


@dataclass(frozen=True, slots=True)
class NodeSpec:
    name: str
    index: int  # 1..: LAN host index - 1, pod subnet number

    @property
    def ipv4(self) -> str:
        return f"{LAN4}.{self.index + 1}"

    @property
    def ipv6(self) -> str:
        return f"{LAN6}:{self.index + 1}"

    @property
    def pod_cidrs(self) -> tuple[str, str]:
        return f"10.244.{self.index}.0/24", f"fd00:244:0:{self.index}::/64"

    @property
    def gateways(self) -> tuple[str, str]:
        """The node's addresses on its pod bridge."""
        return f"10.244.{self.index}.1", f"fd00:244:0:{self.index}::1"


@dataclass(frozen=True, slots=True)
class PodSpec:
    name: str
    node: NodeSpec
    host: int  # 2..254

    @property
    def ipv4(self) -> str:
        return f"10.244.{self.node.index}.{self.host}"

    @property
    def ipv6(self) -> str:
        return f"fd00:244:0:{self.node.index}::{self.host:x}"


@dataclass(frozen=True, slots=True)
class ClientSpec:
    """A machine outside the cluster, on the nodes' LAN."""

    name: str
    host: int  # 10..254

    @property
    def ipv4(self) -> str:
        return f"{LAN4}.{self.host}"

    @property
    def ipv6(self) -> str:
        return f"{LAN6}:{self.host:x}"


@dataclass(frozen=True, slots=True)
class LabSpec:
    """Nodes with pods, and external clients that reach services through ``entry``."""

    nodes: tuple[NodeSpec, ...]
    pods: tuple[PodSpec, ...]
    clients: tuple[ClientSpec, ...] = ()
    entry: str = "node1"

    def node(self, name: str) -> NodeSpec:
        return next(n for n in self.nodes if n.name == name)

    def pod(self, name: str) -> PodSpec:
        return next(p for p in self.pods if p.name == name)


def standard_spec() -> LabSpec:
    """node1 with pods a, b and a client pod; node2 with pods c, d; two external clients."""
    n1, n2 = NodeSpec("node1", 1), NodeSpec("node2", 2)
    pods = (
        PodSpec("pod-a", n1, 10),
        PodSpec("pod-b", n1, 11),
        PodSpec("client", n1, 50),
        PodSpec("pod-c", n2, 10),
        PodSpec("pod-d", n2, 11),
    )
    clients = (ClientSpec("ext-ok", 100), ClientSpec("ext-no", 200))
    return LabSpec((n1, n2), pods, clients)
