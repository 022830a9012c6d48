"""Stale UDP conntrack cleanup against the real kernel, in namespaces this test creates.

client ns --veth-- node ns --veth-- pod1 ns
                       \\---veth-- pod2 ns

The node DNATs the UDP "service" 10.96.0.10:53 with an nft rule this test
writes (standing in for a backend); the pods answer with their name.
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from svcproxy.agent.conntrack_cli import ConntrackCleaner, ConntrackCLI
from svcproxy.model import Endpoint, Protocol, ServicePort, ServicePortKey, ServicePortState
from svcproxy.sdk.backend import NodeState

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


def run(*args: str) -> str:
    return subprocess.run(args, check=True, capture_output=True, text=True, timeout=20).stdout


@dataclass
class Lab:
    suffix: str
    names: dict[str, str] = field(default_factory=dict)
    procs: list[subprocess.Popen[str]] = field(default_factory=list)
    client: subprocess.Popen[str] | None = None

    def ns(self, role: str) -> str:
        return self.names[role]

    def exec(self, role: str, *args: str) -> str:
        return run("ip", "netns", "exec", self.ns(role), *args)

    def nft(self, script: str) -> None:
        subprocess.run(["ip", "netns", "exec", self.ns("node"), "nft", "-f", "-"], input=script,
                       check=True, capture_output=True, text=True, timeout=20)

    def ask(self) -> str:
        """One datagram from the client's fixed source port to the service; who answered."""
        assert self.client is not None and self.client.stdin and self.client.stdout
        self.client.stdin.write("go\n")
        self.client.stdin.flush()
        return self.client.stdout.readline().strip()

    def entries(self) -> str:
        return self.exec("node", "conntrack", "-L", "-p", "udp", "--orig-dst", SERVICE_IP)

    def start(self, role: str, script: str, *args: str) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            ["ip", "netns", "exec", self.ns(role), sys.executable, "-c", script, *args],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self.procs.append(proc)
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        return proc


def _link(lab: Lab, peer: str, index: int, peer_ip: str) -> None:
    node_if, peer_if = f"n{index}{lab.suffix}", f"p{index}{lab.suffix}"
    run("ip", "-n", lab.ns("node"), "link", "add", node_if, "type", "veth", "peer", "name",
        peer_if, "netns", lab.ns(peer))
    gateway = f"10.200.{index}.1"
    run("ip", "-n", lab.ns("node"), "addr", "add", f"{gateway}/24", "dev", node_if)
    run("ip", "-n", lab.ns("node"), "link", "set", node_if, "up")
    run("ip", "-n", lab.ns(peer), "addr", "add", f"{peer_ip}/24", "dev", peer_if)
    run("ip", "-n", lab.ns(peer), "link", "set", peer_if, "up")
    run("ip", "-n", lab.ns(peer), "link", "set", "lo", "up")
    run("ip", "-n", lab.ns(peer), "route", "add", "default", "via", gateway)


@pytest.fixture
def lab() -> Iterator[Lab]:
    reason = _missing()
    if reason:
        print(f"skipping: {reason}")
        pytest.skip(reason)
    suffix = f"{os.getpid() % 10000}{random.randint(0, 999)}"
    lab = Lab(suffix)
    try:
        for role in ("client", "node", "pod1", "pod2"):
            lab.names[role] = f"svcp-ct-{role}-{suffix}"
            run("ip", "netns", "add", lab.names[role])
        _link(lab, "client", 0, CLIENT_IP)
        _link(lab, "pod1", 1, PODS["pod1"])
        _link(lab, "pod2", 2, PODS["pod2"])
        lab.exec("node", "sysctl", "-qw", "net.ipv4.ip_forward=1")
        for pod in PODS:
            lab.start(pod, SERVER, pod, str(POD_PORT))
        lab.client = lab.start("client", CLIENT, CLIENT_IP, SERVICE_IP, str(SERVICE_PORT))
        yield lab
    finally:
        for proc in lab.procs:
            proc.kill()
            proc.wait(timeout=5)
        for name in lab.names.values():
            subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=20)


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
    run("ip", "-n", lab.ns("node"), "route", "add", f"{SERVICE_IP}/32", "via", PODS["pod1"])
    lab.nft(dnat_to())
    assert lab.ask() == "no answer"
    assert SERVICE_IP in lab.entries()

    lab.nft(dnat_to("pod2"))
    assert lab.ask() == "no answer", "without cleanup the un-NATed entry keeps the flow"

    deleted = cleaner(lab).after_sync(service(), service("pod2"))
    assert deleted >= 1
    assert lab.ask() == "pod2"
