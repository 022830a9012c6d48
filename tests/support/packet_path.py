"""What the ebpf packet-path tests share: what they need on the machine (as their
module's marks), the service records they give the backend (``node_port``) and the
lab they run in (``World``, with namespaces routed through a veth of their own on the
node, as a pod or a client behind a named device is)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, Self

import pytest

from svcproxy.backends.ebpf.packet_backend import PacketBackend
from svcproxy.backends.ebpf.packet_loader import OBJECT, PacketLayout
from svcproxy.model import (
    Endpoint,
    Protocol,
    ServicePort,
    ServicePortKey,
    ServicePortState,
    ServiceType,
)
from svcproxy.sdk import Changes, NodeConfig, NodeContext, NodeState
from tests.support.lab.checksums import tx_checksums_off
from tests.support.lab.client import probe, summarize
from tests.support.lab.echo import EchoServer
from tests.support.lab.netns import call_in, ip
from tests.support.lab.plan import standard_spec
from tests.support.lab.topology import Lab, addresses, veth


def missing(*tools: str) -> str:
    """Why the packet path cannot be tested here ("" when it can)."""
    if os.geteuid() != 0:
        return "needs root"
    absent = [tool for tool in tools if shutil.which(tool) is None]
    if absent:
        return "needs " + " and ".join("iproute2" if t == "ip" else t for t in tools)
    if not OBJECT.exists():
        return f"{OBJECT} not built (python -m svcproxy.backends.ebpf.build)"
    return ""


def marks(*tools: str) -> list[pytest.MarkDecorator]:
    """A module's ``pytestmark``: network namespaces, skipped where ``missing`` says."""
    why = missing(*tools)
    return [pytest.mark.netns, pytest.mark.skipif(bool(why), reason=why)]


SPEC = standard_spec()
NODE1 = SPEC.node("node1")
CLIENT = SPEC.clients[0]
PODS = {p.name: p for p in SPEC.pods}


def node_port(name: str, port: int, pods: list[str], proto: str = "TCP", family: int = 4,
              *, node: str = "node1", subnet: int = 1, cip: str = "", target: int = 8080,
              external: list[str] | None = None, internal: list[str] | None = None,
              **extra: Any) -> ServicePortState:
    """A service ``port`` -> ``target`` on ``pods``, as ``node``'s backend gets it (its
    pods are local): a NodePort ``port`` unless ``extra`` sets another type; its ClusterIP
    ``cip``, else 10.96.``subnet``.(port % 200) (fd00:96::``subnet``:... for IPv6);
    ``external`` and ``internal`` narrow the frontend's flags (default: every
    endpoint)."""
    key = ServicePortKey("default", name, "p", Protocol(proto))
    extra.setdefault("type", ServiceType.NODE_PORT)
    if not cip:
        cip = (f"10.96.{subnet}.{port % 200}" if family == 4 else
               f"fd00:96::{subnet}:{port % 200:x}")
    svc = ServicePort(key, cluster_ips=(cip,), port=80, node_port=port,
                      has_endpoints=bool(pods), **extra)
    eps = {}
    for pod in pods:
        spec = PODS[pod]
        ip = spec.ipv4 if family == 4 else spec.ipv6
        here = spec.node.name == node
        eps[ip] = Endpoint(ip, target, is_local=here, node_name=spec.node.name,
                           internal=internal is None or pod in internal,
                           external=external is None or pod in external,
                           cluster=True, local=here)
    return ServicePortState(svc, eps)


Record = ServicePortState | Callable[[str], ServicePortState]


class World:
    """The two-node lab, echo servers (port 8080) in ``servers``, a bpffs mounted for the
    test, and a packet backend on each of ``nodes`` serving ``devices`` (``layout``:
    the rest of PacketLayout's options); ``whole_checksums``: the namespaces whose
    senders write whole checksums (XDP's incremental updates need them). Everything is
    removed by ``stop()``, also after a failure."""

    def __init__(self, prefix: str, nodes: tuple[str, ...] = ("node1",),
                 devices: tuple[str, ...] = ("eth0", "br0"),
                 servers: tuple[str, ...] = ("pod-a", "pod-b", "pod-c", "pod-d"),
                 whole_checksums: tuple[str, ...] = (), **layout: Any) -> None:
        self.lab = Lab(spec=SPEC)
        self.bpffs = Path(tempfile.mkdtemp(prefix=prefix))
        self.mounted = False
        self.nodes, self.devices, self.options = nodes, devices, layout
        self.server_names, self.whole_checksums = servers, whole_checksums
        self.servers: list[EchoServer] = []
        self.backends: dict[str, PacketBackend] = {}
        self.views: dict[str, dict[ServicePortKey, ServicePortState]] = {n: {} for n in nodes}
        self.revision = 0

    def start(self) -> Self:
        self.lab.build()
        for name in self.whole_checksums:
            tx_checksums_off(self.lab.ns(name))
        for name in self.server_names:
            self.servers.append(EchoServer(self.lab.ns(name), name, (8080,)).start())
        subprocess.run(["mount", "-t", "bpf", "bpf", str(self.bpffs)], check=True)
        self.mounted = True
        for node in self.nodes:
            spec = SPEC.node(node)
            config = NodeConfig(node_name=node, node_ips=(spec.ipv4, spec.ipv6))
            self.backends[node] = PacketBackend(config, self.layout(node))
        return self

    def layout(self, node: str = "node1") -> PacketLayout:
        """``node``'s layout: its pins under ``pins`` (one node) or its name."""
        pins = self.bpffs / ("pins" if len(self.nodes) == 1 else node)
        return PacketLayout(pins, self.devices, **self.options)

    def stop(self) -> None:
        try:
            for node, backend in self.backends.items():
                call_in(self.lab.ns(node), backend.cleanup)
        finally:
            for server in self.servers:
                server.stop()
            if self.mounted:
                subprocess.run(["umount", str(self.bpffs)], capture_output=True)
            shutil.rmtree(self.bpffs, ignore_errors=True)
            self.lab.destroy()

    @property
    def backend(self) -> PacketBackend | None:
        """The first node's backend."""
        return self.backends.get(self.nodes[0])

    @property
    def services(self) -> dict[ServicePortKey, ServicePortState]:
        """What the first node's backend was given."""
        return self.views[self.nodes[0]]

    @property
    def node(self) -> str:
        """The first node's namespace."""
        return self.lab.ns(self.nodes[0])

    def in_node(self, fn: Callable[..., Any], *args: Any) -> Any:
        return call_in(self.node, fn, *args)

    def tc_links(self) -> set[str]:
        """The names of the first node's pinned tc links (``link_<device>_<hook>``)."""
        pins = self.bpffs / ("pins" if len(self.nodes) == 1 else self.nodes[0])
        return {p.name for p in (pins / "tc").glob("link_*")}

    def add_routed(self, name: str, device: str, address: str, gateway: str) -> str:
        """A namespace routed through its own veth ``device`` on the first node, made now
        (Calico-style: ``address``/32, its gateway ``gateway`` an address of the node's
        end, no bridge); returns it. ``remove_routed`` removes it."""
        ns = self.lab.add_ns(name)
        veth(ns, "eth0", self.node, device)
        addresses(ns, "eth0", f"{address}/32")
        ip(ns, "route", "add", gateway, "dev", "eth0")
        ip(ns, "route", "add", "default", "via", gateway, "dev", "eth0", "onlink")
        addresses(self.node, device, f"{gateway}/32")
        ip(self.node, "route", "add", f"{address}/32", "dev", device)
        return ns

    def remove_routed(self, ns: str, device: str) -> None:
        """``ns`` and its veth ``device`` (the node's end, if it is still there)."""
        ip(self.node, "link", "del", device, check=False)
        self.lab.created.remove(ns)
        subprocess.run(["ip", "netns", "del", ns], check=True)

    def set(self, record: Record) -> None:
        """The service on every node: ``record``, or ``record(node)`` as each node sees it."""
        for node in self.nodes:
            state = record(node) if callable(record) else record
            self.views[node][state.key] = state
            self.sync(Changes(frozenset({state.key})), node=node)

    def delete(self, key: ServicePortKey) -> None:
        for node in self.nodes:
            self.views[node].pop(key, None)
            self.sync(Changes(frozenset({key})), node=node)

    def sync(self, changes: Changes, context: NodeContext | None = None,
             node: str = "") -> None:
        node = node or self.nodes[0]
        self.revision += 1
        state = NodeState(node, self.revision, None, dict(self.views[node]), context)
        call_in(self.lab.ns(node), self.backends[node].sync, state, changes)

    def tcp(self, port: int, count: int = 12) -> Any:
        return summarize(probe(self.lab.ns(CLIENT.name), "tcp", NODE1.ipv4, port, count))

    def udp(self, port: int, count: int = 12) -> Any:
        return summarize(probe(self.lab.ns(CLIENT.name), "udp", NODE1.ipv4, port, count))
