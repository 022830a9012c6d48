"""The iptables backend against the real kernel: real packets in namespaces this test creates.

Topology (tests.support.lab.topology's namespaces, unique per run): a node namespace with
two pods on veths
(10.244.1.2, .3 and fd00:244::2, ::3), and an outside client on 192.168.50.0/24
(two source addresses) / fd00:50::/64 routed to the node. The backend runs in
this process and programs only the node namespace (``ip netns exec``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace

import pytest

from svcproxy.backends.iptables import names
from svcproxy.backends.iptables.backend import IptablesBackend, IptablesOptions
from svcproxy.model import (
    Endpoint,
    Protocol,
    ServicePort,
    ServicePortKey,
    ServicePortState,
    ServiceType,
)
from svcproxy.sdk.backend import Changes, NodeState
from svcproxy.sdk.config import NodeConfig
from svcproxy.sdk.node_context import ContextResolver
from tests.support.lab.netns import call_in, ip, ns_exec, sysctl
from tests.support.lab.topology import Namespaces, addresses, default_routes, veth
from tests.support.waiting import wait_for

pytestmark = pytest.mark.netns

NODE_IP = "192.168.50.1"
NODE_IP6 = "fd00:50::1"
PODS = {"pod-a": ("10.244.1.2", "fd00:244::2"), "pod-b": ("10.244.1.3", "fd00:244::3")}
CLUSTER_CIDRS = ("10.244.0.0/16", "fd00:244::/64")

SERVER = r"""
import socket, sys, threading
name, port = sys.argv[1], int(sys.argv[2])
def serve(conn, peer):
    with conn:
        conn.sendall(f"{name} {peer[0]}\n".encode())
s = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
s.bind(("::", port)); s.listen(128)
print("ready", flush=True)
while True:
    c, p = s.accept()
    p = (p[0].removeprefix("::ffff:"),)
    threading.Thread(target=serve, args=(c, p), daemon=True).start()
"""

CLIENT = r"""
import json, socket, sys, time
host, port, count, seconds, source = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), \
    float(sys.argv[4]), sys.argv[5]
family = socket.AF_INET6 if ":" in host else socket.AF_INET
out, end = [], time.monotonic() + seconds
while len(out) < count and (seconds <= 0 or time.monotonic() < end):
    s = socket.socket(family, socket.SOCK_STREAM)
    s.settimeout(1.0)
    try:
        if source:
            s.bind((source, 0))
        s.connect((host, port))
        out.append(s.recv(200).decode().strip() or "empty")
    except ConnectionRefusedError:
        out.append("refused")
    except OSError as e:
        out.append("timeout" if isinstance(e, TimeoutError) else f"error {e}")
    finally:
        s.close()
    if seconds > 0:
        time.sleep(0.01)
print(json.dumps(out))
"""


@dataclass(kw_only=True)
class Lab(Namespaces):
    """The node, the client and the pods (``pods``: name to namespace), each pod serving on
    8080 and 9090."""

    @property
    def node(self) -> str:
        return self.ns("node")

    @property
    def client(self) -> str:
        return self.ns("client")

    @property
    def pods(self) -> dict[str, str]:
        return {name: self.ns(name) for name in PODS}

    def prefix(self) -> tuple[str, ...]:
        return ("ip", "netns", "exec", self.node)

    def connect(self, ns: str, host: str, port: int, count: int = 1, source: str = "",
                seconds: float = 0.0) -> list[str]:
        out = ns_exec(ns, sys.executable, "-c", CLIENT, host, str(port), str(count),
                      str(seconds), source)
        return json.loads(out)

    def background(self, ns: str, host: str, port: int, seconds: float) -> subprocess.Popen[str]:
        return subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-c", CLIENT, host,
                                 str(port), "100000", str(seconds), ""],
                                stdout=subprocess.PIPE, text=True)

    def iptables_save(self, family: int = 4, mode: str = "nft", counters: bool = False) -> str:
        binary = f"{'iptables' if family == 4 else 'ip6tables'}-{mode}-save"
        return ns_exec(self.node, binary, *(["-c"] if counters else []))

    def _build(self) -> None:
        node, client = self.add_ns("node"), self.add_ns("client")
        for name in PODS:
            self.add_ns(name)
        # The node routes ClusterIPs back out of the interface they came in on: no ICMP
        # redirects, or the client would bypass the node for the REJECT.
        for key, value in (("net.ipv4.ip_forward", "1"), ("net.ipv6.conf.all.forwarding", "1"),
                           ("net.ipv4.conf.all.send_redirects", "0"),
                           ("net.ipv4.conf.default.send_redirects", "0")):
            sysctl(node, key, value)
        veth(node, "vext", client, "eth0")
        addresses(node, "vext", f"{NODE_IP}/24", f"{NODE_IP6}/64")
        addresses(client, "eth0", "192.168.50.2/24", "192.168.50.3/24", "fd00:50::2/64")
        default_routes(client, "eth0", NODE_IP, NODE_IP6)
        for i, (name, pod) in enumerate(self.pods.items()):
            ip4, ip6 = PODS[name]
            link = f"vp{i}"
            veth(node, link, pod, "eth0")
            addresses(node, link, "10.244.1.1/32", "fd00:244::1/128")
            ip(node, "route", "add", f"{ip4}/32", "dev", link)
            ip(node, "-6", "route", "add", f"{ip6}/128", "dev", link)
            addresses(pod, "eth0", f"{ip4}/32", f"{ip6}/128")
            ip(pod, "route", "add", "10.244.1.1/32", "dev", "eth0")
            ip(pod, "-6", "route", "add", "fd00:244::1/128", "dev", "eth0")
            default_routes(pod, "eth0", "10.244.1.1", "fd00:244::1")
            for port in ("8080", "9090"):
                self.start(pod, SERVER, name, port)
        # The node reaches ClusterIPs through a route, as on a real node.
        ip(node, "route", "add", "172.30.0.0/16", "dev", "vext")
        ip(node, "-6", "route", "add", "fd00:30::/64", "dev", "vext")
        ip(client, "route", "add", "172.30.0.0/16", "via", NODE_IP)
        ip(client, "-6", "route", "add", "fd00:30::/64", "via", NODE_IP6)


def _needs_root() -> None:
    if os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("iptables-nft-restore"):
        pytest.skip("needs root, iproute2 and iptables (nft and legacy)")


@pytest.fixture
def lab() -> Iterator[Lab]:
    _needs_root()
    built = Lab().build()
    try:
        yield built
    finally:
        built.destroy()


def config(**overrides: object) -> NodeConfig:
    base: dict[str, object] = {"node_name": "node1", "cluster_cidrs": CLUSTER_CIDRS,
                               "node_ips": (NODE_IP, NODE_IP6)}
    return NodeConfig(**(base | overrides))  # type: ignore[arg-type]


def backend(lab: Lab, cfg: NodeConfig | None = None, **options: object) -> IptablesBackend:
    opts = IptablesOptions(prefix=lab.prefix(), **options)  # type: ignore[arg-type]
    return IptablesBackend(cfg or config(), opts)


def service(name: str, ip: str, pods: tuple[str, ...], *, port: int = 80, target: int = 8080,
            node_port: int = 0, ip6: str = "") -> ServicePortState:
    key = ServicePortKey("default", name, "http", Protocol.TCP)
    svc = ServicePort(key, type=ServiceType.NODE_PORT if node_port else ServiceType.CLUSTER_IP,
                      cluster_ips=(ip, ip6) if ip6 else (ip,), port=port, node_port=node_port,
                      has_endpoints=bool(pods))
    eps: dict[str, Endpoint] = {}
    for pod in pods:
        for address in PODS[pod][: 2 if ip6 else 1]:
            eps[address] = Endpoint(address, target, is_local=True, internal=True,
                                    external=True, cluster=True, local=True)
    return ServicePortState(svc, eps)


def node_state(*services: ServicePortState, revision: int = 1) -> NodeState:
    return NodeState("node1", revision, None, {s.key: s for s in services})


def agent_state(lab: Lab, be: IptablesBackend, *services: ServicePortState) -> NodeState:
    """The state with the node context the agent resolves in the node's namespace (where
    it also sets the mode's sysctls), as ``svcproxy backend iptables`` would get it."""
    context = call_in(lab.node, ContextResolver.for_backend(be.config, be), None)
    return replace(node_state(*services), context=context)


def full() -> Changes:
    return Changes(full=True, reason="initial")


def changed(*services: ServicePortState) -> Changes:
    return Changes(services=frozenset(s.key for s in services))


def pod_names(answers: list[str]) -> set[str]:
    return {a.split()[0] for a in answers}


def test_cluster_ip_and_nodeport_reach_every_endpoint_with_masquerade(lab: Lab) -> None:
    web = service("web", "172.30.0.10", ("pod-a", "pod-b"), node_port=30080)
    be = backend(lab)
    be.sync(node_state(web), full())
    assert be.mode == "nft"
    via_cluster_ip = lab.connect(lab.client, "172.30.0.10", 80, count=30)
    assert pod_names(via_cluster_ip) == {"pod-a", "pod-b"}
    # From outside the cluster CIDR: masqueraded to the node's address towards the pod.
    assert {a.split()[1] for a in via_cluster_ip} == {"10.244.1.1"}
    via_node_port = lab.connect(lab.client, NODE_IP, 30080, count=30)
    assert pod_names(via_node_port) == {"pod-a", "pod-b"}
    from_pod = lab.connect(lab.pods["pod-a"], "172.30.0.10", 80, count=30)
    assert pod_names(from_pod) == {"pod-a", "pod-b"}
    # Pod to service keeps the pod's address, except hairpin (to itself) which is masqueraded.
    assert {a.split()[1] for a in from_pod if a.startswith("pod-b")} == {"10.244.1.2"}
    assert {a.split()[1] for a in from_pod if a.startswith("pod-a")} == {"10.244.1.1"}


def test_service_without_endpoints_refuses_at_once(lab: Lab) -> None:
    be = backend(lab)
    be.sync(node_state(service("empty", "172.30.0.11", (), node_port=30081)), full())
    # "refused", not "timeout" (the client waits 1 s): answered at once; the wall time
    # around these two client processes measured their start-up on a loaded machine
    assert lab.connect(lab.client, "172.30.0.11", 80) == ["refused"]
    assert lab.connect(lab.client, NODE_IP, 30081) == ["refused"]


def test_localhost_nodeports_need_route_localnet_in_the_node_only(lab: Lab) -> None:
    root_before = open("/proc/sys/net/ipv4/conf/all/route_localnet").read()
    web = service("web", "172.30.0.10", ("pod-a",), node_port=30080)
    be = backend(lab)
    be.sync(agent_state(lab, be, web), full())
    assert lab.connect(lab.node, "127.0.0.1", 30080, count=3) == ["pod-a 10.244.1.1"] * 3
    assert ns_exec(lab.node, "sysctl", "-n", "net.ipv4.conf.all.route_localnet").strip() == "1"
    assert open("/proc/sys/net/ipv4/conf/all/route_localnet").read() == root_before


def test_localhost_nodeports_off_leaves_loopback_alone(lab: Lab) -> None:
    web = service("web", "172.30.0.10", ("pod-a",), node_port=30080)
    backend(lab, localhost_nodeports=False).sync(node_state(web), full())
    assert lab.connect(lab.node, "127.0.0.1", 30080) == ["refused"]
    assert lab.connect(lab.client, NODE_IP, 30080) == ["pod-a 10.244.1.1"]


def test_ipv6_services_go_through_ip6tables(lab: Lab) -> None:
    web = service("web", "172.30.0.10", ("pod-a", "pod-b"), ip6="fd00:30::10", node_port=30080)
    be = backend(lab)
    be.sync(node_state(web), full())
    answers = lab.connect(lab.client, "fd00:30::10", 80, count=30)
    assert pod_names(answers) == {"pod-a", "pod-b"}
    assert pod_names(lab.connect(lab.client, NODE_IP6, 30080, count=10)) <= {"pod-a", "pod-b"}
    assert "fd00:30::10" in lab.iptables_save(6)
    assert "fd00:30::10" not in lab.iptables_save(4)


def _dnat_packets(save: str, chain: str) -> int:
    """Packets counted by the DNAT rule of one KUBE-SEP chain (iptables-save -c)."""
    for line in save.splitlines():
        if f"-A {chain} " in line and "DNAT" in line:
            return int(line.split("]")[0].lstrip("[").split(":")[0])
    raise AssertionError(f"no DNAT rule in {chain}")


def test_partial_sync_leaves_other_services_running_untouched(lab: Lab) -> None:
    steady = service("steady", "172.30.0.20", ("pod-a",))
    moving = service("moving", "172.30.0.21", ("pod-a",), target=9090)
    be = backend(lab)
    be.sync(node_state(steady, moving), full())
    steady_sep = names.endpoint_chain(steady.key, steady.endpoints["10.244.1.2"])
    client = lab.background(lab.client, "172.30.0.20", 80, seconds=3.0)
    try:
        # the client's first connections (its interpreter starts in the namespace)
        wait_for(lambda: _dnat_packets(lab.iptables_save(counters=True), steady_sep) > 0,
                 interval=0.1)
        before = _dnat_packets(lab.iptables_save(counters=True), steady_sep)
        versions = [("pod-a", "pod-b"), ("pod-b",), ("pod-a",), ()]
        for i, pods in enumerate(versions * 2):
            moving = service("moving", "172.30.0.21", pods, target=9090)
            be.sync(node_state(steady, moving, revision=i + 2), changed(moving))
            written = [r for r in be.reports if r.family == 4][0]
            assert not written.full
            time.sleep(0.1)
        after = _dnat_packets(lab.iptables_save(counters=True), steady_sep)
    finally:
        out, _ = client.communicate(timeout=10)
    answers = json.loads(out)
    assert len(answers) > 50
    assert set(answers) == {"pod-a 10.244.1.1"}, "a connection to the steady service failed"
    # Counters survive only in chains nobody rewrote.
    assert after > before > 0
    assert lab.connect(lab.client, "172.30.0.21", 80) == ["refused"]


def test_endpoint_change_is_a_small_transaction(lab: Lab) -> None:
    services = [service(f"s{i}", f"172.30.1.{i}", ("pod-a", "pod-b")) for i in range(1, 50)]
    be = backend(lab)
    be.sync(node_state(*services), full())
    services[7] = service("s8", "172.30.1.8", ("pod-b",))
    be.sync(node_state(*services, revision=2), changed(services[7]))
    report = [r for r in be.reports if r.family == 4][0]
    assert (report.chains_written, report.chains_deleted) == (1, 1)
    assert lab.connect(lab.client, "172.30.1.8", 80, count=5) == ["pod-b 10.244.1.1"] * 5


def _flush_everything(lab: Lab) -> None:
    """What a firewall reload does: flush and delete every chain of every table."""
    for table in ("filter", "nat", "mangle"):
        ns_exec(lab.node, "iptables-nft", "-t", table, "-F")
        ns_exec(lab.node, "iptables-nft", "-t", table, "-X")


def test_flushed_rules_come_back_at_the_next_periodic_sync(lab: Lab) -> None:
    web = service("web", "172.30.0.10", ("pod-a",))
    be = backend(lab)
    state = node_state(web)
    be.sync(state, full())
    periodic = Changes(services=frozenset(state.services), full=True, reason="periodic")
    be.sync(state, periodic)
    assert [r.chains_written for r in be.reports if r.family == 4] == [0]
    _flush_everything(lab)
    assert lab.connect(lab.client, "172.30.0.10", 80) == ["timeout"]
    be.sync(state, periodic)
    assert [r.full for r in be.reports if r.family == 4] == [True]
    assert lab.connect(lab.client, "172.30.0.10", 80) == ["pod-a 10.244.1.1"]
    assert "-j KUBE-SERVICES" in lab.iptables_save()


def test_a_resync_rewrites_a_chain_flushed_behind_its_back_and_the_hourly_one_all(
        lab: Lab) -> None:
    """The canary stays, so only the drift check notices (issue 27: before, the chain
    stayed flushed until full_sync_interval had passed): the first periodic resync
    writes the applied rules again, not rendered; the hourly one rewrites them too."""
    web = service("web", "172.30.0.10", ("pod-a",))
    be = backend(lab)
    now = [0.0]
    be.clock = lambda: now[0]
    state = node_state(web)
    be.sync(state, full())
    ns_exec(lab.node, "iptables-nft", "-t", "nat", "-F", "KUBE-SERVICES")
    assert lab.connect(lab.client, "172.30.0.10", 80) == ["timeout"]
    periodic = Changes(services=frozenset(state.services), full=True, reason="periodic")
    now[0] = be.full_sync_interval - 1
    be.sync(state, periodic)
    assert [(r.full, r.rendered) for r in be.reports if r.family == 4] == [(True, 0)]
    assert lab.connect(lab.client, "172.30.0.10", 80) == ["pod-a 10.244.1.1"]
    be.sync(state, periodic)
    assert [r.chains_written for r in be.reports if r.family == 4] == [0]
    now[0] += be.full_sync_interval  # counted from that rewrite
    be.sync(state, periodic)
    assert [(r.full, r.rendered) for r in be.reports if r.family == 4] == [(True, 0)]
    assert lab.connect(lab.client, "172.30.0.10", 80) == ["pod-a 10.244.1.1"]


def test_a_change_after_a_flush_restores_everything(lab: Lab) -> None:
    web, api = service("web", "172.30.0.10", ("pod-a",)), service("api", "172.30.0.12", ())
    be = backend(lab)
    be.sync(node_state(web, api), full())
    _flush_everything(lab)
    api = service("api", "172.30.0.12", ("pod-b",))
    be.sync(node_state(web, api, revision=2), changed(api))
    assert lab.connect(lab.client, "172.30.0.10", 80) == ["pod-a 10.244.1.1"]
    assert lab.connect(lab.client, "172.30.0.12", 80) == ["pod-b 10.244.1.1"]


def _foreign_rules(lab: Lab) -> None:
    for args in (["-t", "nat", "-N", "MY-NAT"], ["-t", "nat", "-A", "PREROUTING", "-j", "MY-NAT"],
                 ["-t", "nat", "-A", "MY-NAT", "-s", "1.2.3.4", "-j", "RETURN"],
                 ["-A", "INPUT", "-s", "5.6.7.8", "-j", "DROP"]):
        ns_exec(lab.node, "iptables-nft", *args)


BUILTIN = {"INPUT", "FORWARD", "OUTPUT", "PREROUTING", "POSTROUTING"}


def _rules_only(save: str) -> list[str]:
    """User chains and every rule of an iptables-save output (empty tables ignored)."""
    chains = [line.split()[0] for line in save.splitlines() if line.startswith(":")]
    rules = [line for line in save.splitlines() if line.startswith("-A")]
    return sorted([c for c in chains if c[1:] not in BUILTIN] + rules)


def test_cleanup_removes_our_rules_and_keeps_everyone_elses(lab: Lab) -> None:
    _foreign_rules(lab)
    before4, before6 = lab.iptables_save(4), lab.iptables_save(6)
    be = backend(lab)
    be.sync(node_state(service("web", "172.30.0.10", ("pod-a",), ip6="fd00:30::10",
                               node_port=30080)), full())
    assert "KUBE-SEP-" in lab.iptables_save(4) and "KUBE-SEP-" in lab.iptables_save(6)
    backend(lab).cleanup()
    assert _rules_only(lab.iptables_save(4)) == _rules_only(before4)
    assert _rules_only(lab.iptables_save(6)) == _rules_only(before6)
    assert "MY-NAT" in lab.iptables_save(4)


def test_legacy_node_gets_legacy_rules(lab: Lab) -> None:
    ns_exec(lab.node, "iptables-legacy", "-t", "mangle", "-N", "KUBE-IPTABLES-HINT")
    web = service("web", "172.30.0.10", ("pod-a", "pod-b"))
    be = backend(lab)
    be.sync(agent_state(lab, be, web), full())
    assert be.mode == "legacy"
    assert "KUBE-SERVICES" in lab.iptables_save(4, "legacy")
    assert "KUBE-SERVICES" not in lab.iptables_save(4, "nft")
    assert pod_names(lab.connect(lab.client, "172.30.0.10", 80, count=20)) == {"pod-a", "pod-b"}
    backend(lab).cleanup()
    assert "KUBE-" not in lab.iptables_save(4, "legacy").replace("KUBE-IPTABLES-HINT", "")


def test_restarted_backend_replaces_stale_chains_without_duplicating_jumps(lab: Lab) -> None:
    old, kept = service("old", "172.30.0.30", ("pod-a",)), service("kept", "172.30.0.31",
                                                                   ("pod-b",))
    backend(lab).sync(node_state(old, kept), full())
    before = lab.iptables_save()
    restarted = backend(lab)
    restarted.sync(node_state(kept), full())
    after = lab.iptables_save()
    old_chain = names.SVC_PREFIX + names.service_hash(old.key)
    assert old_chain in before and old_chain not in after
    jumps = [line for line in after.splitlines()
             if line.startswith(("-A PREROUTING", "-A OUTPUT", "-A INPUT", "-A FORWARD"))]
    assert len(jumps) == len(set(jumps)) > 0
    assert lab.connect(lab.client, "172.30.0.31", 80) == ["pod-b 10.244.1.1"]
    assert lab.connect(lab.client, "172.30.0.30", 80) == ["timeout"]


def test_nft_all_chains_form_writes_the_same_rules(lab: Lab,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The ``-S``-first restore (big nft transactions) programs exactly the usual rules,
    on a fresh table and over existing chains, and its two-step cleanup leaves foreign
    rules alone."""
    from svcproxy.backends.iptables import apply as tool
    from svcproxy.backends.iptables import backend as backend_module

    _foreign_rules(lab)
    counted = "[7:700] -A MY-NAT -s 9.9.9.9/32 -j RETURN"  # -S leaves rule counters
    ns_exec(lab.node, "iptables-nft", "-t", "nat", "-A", "MY-NAT", "-s", "9.9.9.9", "-j",
           "RETURN", "-c", "7", "700")
    before4 = lab.iptables_save(4)
    services = (service("web", "172.30.0.10", ("pod-a", "pod-b"), node_port=30080),
                service("api", "172.30.0.11", ("pod-b",)))
    backend(lab).sync(node_state(*services), full())
    usual = _rules_only(lab.iptables_save(4))
    backend(lab).cleanup()
    texts: list[str] = []
    restore = tool.Iptables.restore
    monkeypatch.setattr(tool.Iptables, "restore",
                        lambda self, text: (texts.append(text), restore(self, text))[-1])
    monkeypatch.setattr(backend_module, "ALL_CHAINS_MIN", 0)
    be = backend(lab)
    be.sync(node_state(*services), full())
    assert _rules_only(lab.iptables_save(4)) == usual
    be.sync(node_state(*services), Changes(full=True, reason="hourly"))  # chains exist now
    assert _rules_only(lab.iptables_save(4)) == usual
    assert pod_names(lab.connect(lab.client, "172.30.0.10", 80, count=20)) == {"pod-a", "pod-b"}
    backend(lab).cleanup()
    assert _rules_only(lab.iptables_save(4)) == _rules_only(before4)
    assert sum("*nat\n-S\n" in text for text in texts) >= 3  # 2 full syncs, the cleanup
    assert counted in lab.iptables_save(4, counters=True).splitlines()


# A TCP segment with SYN and FIN set: conntrack marks it INVALID (no valid flag combination).
INVALID_SENDER = r"""
import socket, struct, sys
src, dst, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
def checksum(data):
    total = sum(struct.unpack(f"!{len(data) // 2}H", data))
    total = (total >> 16) + (total & 0xFFFF)
    return ~(total + (total >> 16)) & 0xFFFF
s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_TCP)
s.bind((src, 0))
for i in range(count):
    tcp = struct.pack("!HHIIBBHHH", 40000 + i, 8080, 1, 0, 5 << 4, 0x03, 65535, 0, 0)
    pseudo = socket.inet_aton(src) + socket.inet_aton(dst) + struct.pack("!BBH", 0, 6, len(tcp))
    tcp = tcp[:16] + struct.pack("!H", checksum(pseudo + tcp)) + tcp[18:]
    s.sendto(tcp, (dst, 0))
"""


def _counters(registry: object) -> dict[str, float]:
    """kube-proxy's nfacct metrics in an exposition of ``registry``."""
    from prometheus_client import generate_latest

    found = {}
    for line in generate_latest(registry).decode().splitlines():  # type: ignore[arg-type]
        if line.startswith("kubeproxy_iptables_"):
            name, value = line.split()
            found[name] = float(value)
    return found


def test_nfacct_counters_count_real_packets(lab: Lab) -> None:
    """kube-proxy's two nfacct counters, referenced from the rules, read through netlink
    into /metrics: each connection to a NodePort on 127.0.0.1 is counted once (a NodePort
    on the node's IP is not); each conntrack-INVALID packet forwarded is dropped and
    counted."""
    from prometheus_client import CollectorRegistry

    web = service("web", "172.30.0.10", ("pod-a",), node_port=30080)
    be = backend(lab)
    registry = CollectorRegistry()
    be.register_metrics(registry)
    assert _counters(registry) == {}  # no counter in the kernel yet: nothing exported
    be.sync(agent_state(lab, be, web), full())
    save = lab.iptables_save()
    assert "ct_state_invalid_dropped_pkts" in save and "localhost_nps_accepted_pkts" in save
    localhost = "kubeproxy_iptables_localhost_nodeports_accepted_packets_total"
    invalid = "kubeproxy_iptables_ct_state_invalid_dropped_packets_total"
    assert _counters(registry) == {localhost: 0.0, invalid: 0.0}
    assert lab.connect(lab.node, "127.0.0.1", 30080, count=3) == ["pod-a 10.244.1.1"] * 3
    assert lab.connect(lab.client, NODE_IP, 30080, count=2) == ["pod-a 10.244.1.1"] * 2
    ns_exec(lab.client, sys.executable, "-c", INVALID_SENDER, "192.168.50.2", "10.244.1.2", "4")
    assert lab.connect(lab.client, "172.30.0.10", 80) == ["pod-a 10.244.1.1"]
    assert _counters(registry) == {localhost: 3.0, invalid: 4.0}
