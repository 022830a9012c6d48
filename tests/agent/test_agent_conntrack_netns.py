"""Stale UDP conntrack cleanup against the real kernel, in namespaces this test creates.

client ns --veth-- node ns --veth-- pod1 ns
                       \\---veth-- pod2 ns

The node DNATs the UDP "service" 10.96.0.10:53 with an nft rule this test
writes (standing in for a backend); the pods answer with their name.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from svcproxy.model import Endpoint, Protocol, ServicePort, ServicePortKey, ServicePortState
from svcproxy.sdk.backend import NodeState
from svcproxy.sdk.conntrack_cli import ConntrackCleaner, ConntrackCLI
from tests.support.lab.netns import ip, ns_exec, sysctl
from tests.support.lab.topology import Namespaces, addresses, default_routes, veth

pytestmark = pytest.mark.netns

SERVICE_IP, SERVICE_PORT, POD_PORT = "10.96.0.10", 53, 5353
CLIENT_IP = "10.200.0.2"
PODS = {"pod1": "10.200.1.2", "pod2": "10.200.2.2"}
KEY = ServicePortKey("kube-system", "dns", "dns", Protocol.UDP)

SERVER = textwrap.dedent("""
    import socket, sys
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("0.0.0.0", int(sys.argv[2])))
    print("ready", flush=True)
    while True:
        data, peer = s.recvfrom(512)
        s.sendto(sys.argv[1].encode(), peer)
""")
CLIENT = textwrap.dedent("""
    import socket, sys
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind((sys.argv[1], 40053))
    s.settimeout(0.5)
    print("ready", flush=True)
    for line in sys.stdin:
        s.sendto(b"q", (sys.argv[2], int(sys.argv[3])))
        try:
            print(s.recv(512).decode(), flush=True)
        except (TimeoutError, ConnectionRefusedError):
            print("no answer", flush=True)
""")


def _missing() -> str:
    if os.geteuid() != 0:
        return "needs root for network namespaces"
    for tool in ("ip", "nft", "conntrack"):
        if shutil.which(tool) is None:
            return f"needs {tool}"
    return ""


TIMEOUT = 20.0


@dataclass(kw_only=True)
class Lab(Namespaces):
    """The four namespaces, the pods' servers and the client (which asks on a line of stdin)."""

    client: subprocess.Popen[str] | None = None

    def exec(self, role: str, *args: str) -> str:
        return ns_exec(self.ns(role), *args, timeout=TIMEOUT)

    def nft(self, script: str) -> None:
        ns_exec(self.ns("node"), "nft", "-f", "-", stdin=script, timeout=TIMEOUT)

    def ask(self) -> str:
        """One datagram from the client's fixed source port to the service; who answered."""
        assert self.client is not None and self.client.stdin and self.client.stdout
        self.client.stdin.write("go\n")
        self.client.stdin.flush()
        return self.client.stdout.readline().strip()

    def entries(self) -> str:
        return self.exec("node", "conntrack", "-L", "-p", "udp", "--orig-dst", SERVICE_IP)

    def _build(self) -> None:
        for role in ("client", "node", "pod1", "pod2"):
            self.add_ns(role)
        self._link("client", 0, CLIENT_IP)
        self._link("pod1", 1, PODS["pod1"])
        self._link("pod2", 2, PODS["pod2"])
        sysctl(self.ns("node"), "net.ipv4.ip_forward", "1")
        for pod in PODS:
            self.start(self.ns(pod), SERVER, pod, str(POD_PORT))
        self.client = self.start(self.ns("client"), CLIENT, CLIENT_IP, SERVICE_IP,
                                 str(SERVICE_PORT))

    def _link(self, peer: str, index: int, peer_ip: str) -> None:
        node, gateway = self.ns("node"), f"10.200.{index}.1"
        veth(node, f"n{index}", self.ns(peer), "eth0")
        addresses(node, f"n{index}", f"{gateway}/24")
        addresses(self.ns(peer), "eth0", f"{peer_ip}/24")
        default_routes(self.ns(peer), "eth0", gateway)


@pytest.fixture
def lab() -> Iterator[Lab]:
    reason = _missing()
    if reason:
        print(f"skipping: {reason}")
        pytest.skip(reason)
    built = Lab().build()
    try:
        yield built
    finally:
        built.destroy()


def dnat_to(*pods: str) -> str:
    """The rules a backend would write: DNAT the service to ``pods``, nothing when empty
    (and, as kube-proxy does, drop conntrack-invalid forwarded packets)."""
    rules = ""
    if pods:
        targets = ", ".join(f"{i} : {PODS[p]}" for i, p in enumerate(pods))
        rules = (f"ip daddr {SERVICE_IP} udp dport {SERVICE_PORT} "
                 f"dnat to numgen random mod {len(pods)} map {{ {targets} }} : {POD_PORT}")
    return textwrap.dedent(f"""
        table ip svcptest
        delete table ip svcptest
        table ip svcptest {{
            chain pre {{
                type nat hook prerouting priority dstnat; policy accept;
                {rules}
            }}
            chain forward {{
                type filter hook forward priority filter; policy accept;
                ct state invalid drop
            }}
        }}
    """)


def service(*pods: str) -> NodeState:
    eps = {PODS[p]: Endpoint(PODS[p], POD_PORT) for p in pods}
    svc = ServicePort(KEY, cluster_ips=(SERVICE_IP,), port=SERVICE_PORT, has_endpoints=bool(eps))
    return NodeState("node", 1, None, {KEY: ServicePortState(svc, eps)})


def cleaner(lab: Lab) -> ConntrackCleaner:
    return ConntrackCleaner(ConntrackCLI(["ip", "netns", "exec", lab.ns("node"), "conntrack"]))


def test_removed_endpoint_flow_moves_to_the_remaining_endpoint(lab: Lab) -> None:
    lab.nft(dnat_to("pod1", "pod2"))
    first = lab.ask()
    assert first in PODS, first
    remaining = "pod2" if first == "pod1" else "pod1"
    assert PODS[first] in lab.entries()

    lab.nft(dnat_to(remaining))
    assert lab.ask() == first, "without cleanup the flow sticks to the removed endpoint"

    deleted = cleaner(lab).after_sync(service("pod1", "pod2"), service(remaining))
    assert deleted >= 1
    assert PODS[first] not in lab.entries()
    assert lab.ask() == remaining
    assert lab.ask() == remaining


def test_first_endpoint_replaces_the_blackholed_flow(lab: Lab) -> None:
    # Before the service has endpoints, its datagrams leave the node unanswered.
    ip(lab.ns("node"), "route", "add", f"{SERVICE_IP}/32", "via", PODS["pod1"])
    lab.nft(dnat_to())
    assert lab.ask() == "no answer"
    assert SERVICE_IP in lab.entries()

    lab.nft(dnat_to("pod2"))
    assert lab.ask() == "no answer", "without cleanup the un-NATed entry keeps the flow"

    deleted = cleaner(lab).after_sync(service(), service("pod2"))
    assert deleted >= 1
    assert lab.ask() == "pod2"
