"""Build and tear down the lab's namespaces, links, addresses and routes.

One ``lan`` namespace is the router and the bridge of the nodes' network;
each node has an ``eth0`` on it and a ``br0`` bridge for its pods. Pods have
/32 and /128 addresses and reach everything through their node (so every pod
packet crosses the node's netfilter hooks, as with most CNI plugins); no namespace
sends or accepts ICMP redirects, which would send a pod's replies to another pod on the
same bridge straight over it.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Self

from .netns import LabError, ip, run, sysctl
from .plan import EXTERNAL_CIDRS, LAN4, LAN6, SERVICE_CIDRS, LabSpec, NodeSpec, PodSpec

_NO_REDIRECTS = tuple(
    f"net.{key}" for scope in ("all", "default")
    for key in (f"ipv4.conf.{scope}.send_redirects", f"ipv4.conf.{scope}.accept_redirects",
                f"ipv6.conf.{scope}.accept_redirects"))


def run_tag() -> str:
    """A short per-run tag making names unique among parallel runs."""
    return f"{os.getpid() % 100000}{secrets.token_hex(2)}"


@dataclass(kw_only=True)
class Namespaces:
    """The network namespaces one run makes, ``ns(name)`` each (unique among parallel runs),
    and the processes it starts in them; ``destroy`` kills those, then deletes every
    namespace, last made first (their links go with them)."""

    tag: str = field(default_factory=run_tag)
    created: list[str] = field(default_factory=list)
    processes: list[subprocess.Popen[str]] = field(default_factory=list)

    def ns(self, name: str) -> str:
        return f"sp{self.tag}-{name}"

    def add_ns(self, name: str) -> str:
        """Make namespace ``ns(name)``, its loopback up."""
        ns = self.ns(name)
        run(["ip", "netns", "add", ns])
        self.created.append(ns)
        ip(ns, "link", "set", "lo", "up")
        return ns

    def build(self) -> Self:
        """Make everything (``_build``); on failure remove what was made and re-raise."""
        try:
            self._build()
        except BaseException:
            self.destroy()
            raise
        return self

    def _build(self) -> None:
        raise NotImplementedError

    def start(self, ns: str, script: str, *args: str) -> subprocess.Popen[str]:
        """Run Python ``script`` with ``args`` inside ``ns``, its stdin and stdout piped (text);
        return once it has printed its first line, ``ready``. ``destroy`` kills it."""
        proc = subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-c", script, *args],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.processes.append(proc)
        assert proc.stdout is not None
        if (line := proc.stdout.readline().strip()) != "ready":
            raise LabError(f"a process in {ns} did not start: {line or 'no output'}")
        return proc

    def destroy(self) -> None:
        """Kill every process started, then delete every namespace made (their links go
        with them)."""
        for proc in self.processes:
            proc.kill()
            proc.wait(timeout=5)
        self.processes.clear()
        for ns in reversed(self.created):
            run(["ip", "netns", "del", ns], check=False)
        self.created.clear()


@dataclass
class Lab(Namespaces):
    """A built lab; ``ns(name)`` is the namespace of a node, pod, client or ``lan``."""

    spec: LabSpec

    def _add_ns(self, name: str, forwarding: bool = False) -> str:
        ns = self.add_ns(name)
        sysctl(ns, "net.ipv6.conf.all.accept_dad", "0")
        sysctl(ns, "net.ipv6.conf.default.accept_dad", "0")
        # A REJECT answers with an ICMP error, which the kernel limits per destination
        # (a burst of about 6, then one a second): past it a refusal the tests expect
        # would arrive as a silent drop (measured: 8 of 15 quick probes refused).
        sysctl(ns, "net.ipv4.icmp_ratelimit", "0")
        sysctl(ns, "net.ipv6.icmp.ratelimit", "0")
        # No ICMP redirects (set before any link exists, so every link inherits it): a node
        # forwards a pod's reply out of br0, where it came in, and would redirect the pod to
        # send straight to the other pod over the bridge, past the node's IP layer, where
        # IPVS (which de-NATs after routing) never sees it (measured in the IPVS guest: node1
        # sent 39 redirects, 72 for IPv6; replies from node1's pods were lost under load).
        for key in _NO_REDIRECTS:
            sysctl(ns, key, "0")
        if forwarding:
            sysctl(ns, "net.ipv4.ip_forward", "1")
            sysctl(ns, "net.ipv6.conf.all.forwarding", "1")
        return ns

    def _build(self) -> None:
        lan = self._add_ns("lan", forwarding=True)
        ip(lan, "link", "add", "lan0", "type", "bridge")
        addresses(lan, "lan0", f"{LAN4}.1/24", f"{LAN6}:1/64")
        ip(lan, "link", "set", "lan0", "up")
        for node in self.spec.nodes:
            self._build_node(lan, node)
        for pod in self.spec.pods:
            self._build_pod(pod)
        entry = self.spec.node(self.spec.entry)
        for client in self.spec.clients:
            ns = self._add_ns(client.name)
            veth(ns, "eth0", lan, f"c{client.host}", bridge="lan0")
            addresses(ns, "eth0", f"{client.ipv4}/24", f"{client.ipv6}/64")
            default_routes(ns, "eth0", f"{LAN4}.1", f"{LAN6}:1")
            for cidr in (*SERVICE_CIDRS, *EXTERNAL_CIDRS):
                via = entry.ipv6 if ":" in cidr else entry.ipv4
                ip(ns, "route", "add", cidr, "via", via)

    def _build_node(self, lan: str, node: NodeSpec) -> None:
        ns = self._add_ns(node.name, forwarding=True)
        veth(ns, "eth0", lan, f"n{node.index}", bridge="lan0")
        addresses(ns, "eth0", f"{node.ipv4}/24", f"{node.ipv6}/64")
        default_routes(ns, "eth0", f"{LAN4}.1", f"{LAN6}:1")
        ip(ns, "link", "add", "br0", "type", "bridge")
        gw4, gw6 = node.gateways
        addresses(ns, "br0", f"{gw4}/24", f"{gw6}/64")
        ip(ns, "link", "set", "br0", "up")
        for other in self.spec.nodes:
            if other is not node:
                v4, v6 = other.pod_cidrs
                ip(ns, "route", "add", v4, "via", other.ipv4)
                ip(ns, "-6", "route", "add", v6, "via", other.ipv6)

    def _build_pod(self, pod: PodSpec) -> None:
        ns = self._add_ns(pod.name)
        node_ns = self.ns(pod.node.name)
        veth(ns, "eth0", node_ns, f"veth{pod.host}", bridge="br0")
        # As kubelet's hairpin-veth mode: a pod may reach itself through its service
        # (bridge netfilter DNATs back to the port the frame came from).
        ip(node_ns, "link", "set", f"veth{pod.host}", "type", "bridge_slave", "hairpin", "on")
        addresses(ns, "eth0", f"{pod.ipv4}/32", f"{pod.ipv6}/128")
        gw4, gw6 = pod.node.gateways
        ip(ns, "route", "add", gw4, "dev", "eth0")
        ip(ns, "-6", "route", "add", gw6, "dev", "eth0")
        default_routes(ns, "eth0", gw4, gw6)


def veth(ns: str, name: str, peer_ns: str, peer: str, bridge: str = "") -> None:
    """A veth pair from ``ns`` to ``peer_ns``, both ends up, the peer end enslaved to
    ``bridge`` if one is named."""
    try:
        ip(ns, "link", "add", name, "type", "veth", "peer", "name", peer, "netns", peer_ns)
    except LabError as err:
        raise LabError(f"veth {ns}/{name} <-> {peer_ns}/{peer}: {err}") from None
    if bridge:
        ip(peer_ns, "link", "set", peer, "master", bridge)
    ip(peer_ns, "link", "set", peer, "up")
    ip(ns, "link", "set", name, "up")


def addresses(ns: str, dev: str, *cidrs: str) -> None:
    """Add each address (``ADDR/LEN``) to ``dev``, IPv6 ones without duplicate address
    detection."""
    for cidr in cidrs:
        if ":" in cidr:
            ip(ns, "-6", "addr", "add", cidr, "dev", dev, "nodad")
        else:
            ip(ns, "addr", "add", cidr, "dev", dev)


def default_routes(ns: str, dev: str, *gateways: str) -> None:
    """A default route through each gateway (of its family), on-link on ``dev``."""
    for gateway in gateways:
        family = ("-6",) if ":" in gateway else ()
        ip(ns, *family, "route", "add", "default", "via", gateway, "dev", dev, "onlink")
