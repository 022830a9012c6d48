"""The node agent resolves one node context and hands it to the backend with every state:
node IPs and addresses, IP families, the iptables to invoke, the sysctls it sets."""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import replace

import pytest

from svcproxy.model import NodeInfo, Protocol, ServicePortKey
from svcproxy.sdk import resolve_context
from svcproxy.sdk.backend import Backend, Changes, NodeState
from svcproxy.sdk.config import NodeConfig
from svcproxy.sdk.health import ProxyHealth
from svcproxy.sdk.node_context import ContextResolver
from svcproxy.sdk.runner import SyncRunner
from svcproxy.sdk.testing import FakeSource
from tests.support.waiting import wait_for

CONFIG = NodeConfig("node1", node_ips=("192.168.50.2",), cluster_cidrs=("10.244.0.0/16",),
                    node_port_addresses=("192.168.50.0/24", "127.0.0.0/8"),
                    detect_local_mode="NodeCIDR")

KEY = ServicePortKey("default", "web", "", Protocol.TCP)


def test_resolver_reads_addresses_once_per_node_and_refresh() -> None:
    reads: list[tuple[str, ...]] = []
    now = [0.0]

    def addresses(exclude: tuple[str, ...]) -> tuple[str, ...]:
        reads.append(exclude)
        return ("192.168.50.2", "192.168.50.9", "127.0.0.1")

    resolve = ContextResolver(CONFIG, addresses=addresses, refresh=30, clock=lambda: now[0])
    node = NodeInfo("node1", pod_cidrs=("10.244.1.0/24",))
    first = resolve(node)
    assert first == resolve_context(CONFIG, node, ("192.168.50.2", "192.168.50.9", "127.0.0.1"))
    assert first.family(4).node_port_ips == ("192.168.50.2", "192.168.50.9", "127.0.0.1")
    assert first.family(4).local_traffic.cidrs == ("10.244.1.0/24",)
    assert resolve(node) is first and len(reads) == 1
    assert reads[0] == ("kube-ipvs0",), "IPVS's dummy interface holds no node address"
    moved = replace(node, pod_cidrs=("10.244.2.0/24",))
    assert resolve(moved).family(4).local_traffic.cidrs == ("10.244.2.0/24",)
    now[0] = 31
    resolve(moved)
    assert len(reads) == 3


class Recording(Backend):
    def __init__(self) -> None:
        self.calls: list[tuple[NodeState, Changes]] = []

    def sync(self, state: NodeState, changes: Changes) -> None:
        self.calls.append((state, changes))


def test_runner_hands_the_context_and_a_new_one_is_a_node_change() -> None:
    contexts = iter([resolve_context(CONFIG, None), resolve_context(CONFIG, None),
                     resolve_context(replace(CONFIG, masquerade_all=True), None)])
    source, backend = FakeSource(), Recording()
    runner = SyncRunner(source, backend, health=ProxyHealth(60), min_sync_period=0, poll=0.02,
                        context=lambda _node: next(contexts))
    thread = threading.Thread(target=runner.run, daemon=True)
    thread.start()
    try:
        for revision in (1, 2, 3):
            source.push(NodeState("node1", revision, None, {}), [KEY])
            deadline = time.monotonic() + 5
            while len(backend.calls) < revision and time.monotonic() < deadline:
                time.sleep(0.01)
    finally:
        runner.stop()
        thread.join(5)
    (s1, c1), (s2, c2), (s3, c3) = backend.calls
    assert s1.context == resolve_context(CONFIG, None) and c1.full
    assert s2.context == s1.context and not c2.node_changed
    assert s3.context is not None and s3.context.masquerade_all and c3.node_changed


def test_the_agent_hands_the_dump_backend_its_resolved_context() -> None:
    """What a backend run by the agent gets: the one context, in the dump's snapshot line."""
    import json

    from tests.support.running_agent import dump_agent

    with dump_agent(CONFIG) as (source, agent, out):
        source.push(NodeState("node1", 1, NodeInfo("node1", pod_cidrs=("10.244.3.0/24",)), {}),
                    [KEY])
        wait_for(out.getvalue, timeout=30)
    line = json.loads(out.getvalue().splitlines()[0])
    v4 = line["context"]["families"][0]
    assert v4["node_ips"] == ["192.168.50.2"]
    assert v4["local_traffic"] == {"mode": "NodeCIDR", "cidrs": ["10.244.3.0/24"],
                                   "interface": ""}
    assert agent.context(None).family(4).node_ips == ("192.168.50.2",)


def test_node_facts_are_found_once_and_sysctls_set_for_syncs_only() -> None:
    """The IP families and the node's iptables are looked for once (the iptables only for
    a mode that uses it and leaves the choice to the node); the mode's sysctls are set
    when a sync asks for the context, not when the agent reads the health-check
    addresses at start."""
    from svcproxy.sdk import ProxyMode

    calls: list[str] = []
    set_: list[dict[str, str]] = []

    def resolver(mode: ProxyMode) -> ContextResolver:
        return ContextResolver(
            CONFIG, mode=mode, addresses=lambda _x: ("192.168.50.2",),
            families=lambda: calls.append("families") or (4,),  # type: ignore[func-returns-value]
            iptables=lambda: calls.append("iptables") or "legacy",  # type: ignore[func-returns-value]
            sysctls=lambda wanted: set_.append(dict(wanted)) or [],  # type: ignore[func-returns-value]
            refresh=0)
    resolve = resolver(ProxyMode("iptables", localhost_nodeports=True))
    found = resolve.resolve(None)
    assert (found.ip_families, found.iptables, found.localhost_nodeports) == ((4,), "legacy", True)
    assert set_ == [], "nothing set before a sync"
    for _ in range(3):
        assert resolve(None).sysctls == (("net/ipv4/conf/all/route_localnet", "1"),)
    assert calls == ["families", "iptables"]
    assert set_ == [{"net/ipv4/conf/all/route_localnet": "1"}], "set once"
    calls.clear()
    assert resolver(ProxyMode("iptables", iptables="nft")).resolve(None).iptables == "nft"
    assert resolver(ProxyMode("nftables")).resolve(None).iptables == ""
    assert calls == ["families", "families"], "no iptables looked for"


@pytest.fixture
def netns() -> Iterator[str]:
    from tests.support.netns.harness import netns_or_skip

    with netns_or_skip("spctx") as name:
        yield name


@pytest.mark.netns
def test_the_agent_resolves_and_sets_the_node_in_its_own_namespace(netns: str) -> None:
    """Real namespace: the resolver run where the agent runs finds IPv6 off, the node's
    legacy iptables (a kubelet hint chain), and sets the mode's sysctls there; the root
    namespace is untouched (tests/support/root_sysctls.py guards it)."""
    from svcproxy.backends.iptables.backend import IptablesBackend, IptablesOptions
    from svcproxy.backends.ipvs.backend import IpvsBackend
    from svcproxy.backends.ipvs.options import IpvsOptions
    from tests.support.lab.netns import call_in

    def sysctl(name: str) -> str:
        return subprocess.run(["ip", "netns", "exec", netns, "cat", f"/proc/sys/{name}"],
                              capture_output=True, text=True, check=True).stdout.strip()

    def run(*argv: str) -> None:
        subprocess.run(["ip", "netns", "exec", netns, *argv], check=True, capture_output=True)

    run("ip", "link", "set", "lo", "up")
    assert sysctl("net/ipv4/conf/all/route_localnet") == "0"
    iptables = ContextResolver.for_backend(CONFIG, IptablesBackend(CONFIG))
    found = call_in(netns, iptables, None)
    assert found.ip_families == (4, 6) and found.localhost_nodeports
    assert found.iptables == "nft", "an empty node gets nft"
    assert sysctl("net/ipv4/conf/all/route_localnet") == "1"

    run("sysctl", "-w", "net.ipv6.conf.all.disable_ipv6=1")
    run("iptables-legacy", "-w", "30", "-t", "mangle", "-N", "KUBE-IPTABLES-HINT")
    ipvs = ContextResolver.for_backend(CONFIG, IpvsBackend(CONFIG, IpvsOptions(strict_arp=True)))
    found = call_in(netns, ipvs, None)
    assert found.ip_families == (4,) and found.iptables == "legacy"
    assert "net/ipv6/conf/all/forwarding" not in dict(found.sysctls)
    assert sysctl("net/ipv4/conf/all/arp_ignore") == "1"
    assert sysctl("net/ipv4/ip_forward") == "1"
    chosen = IptablesBackend(CONFIG, IptablesOptions(mode="nft", localhost_nodeports=False))
    assert call_in(netns, ContextResolver.for_backend(CONFIG, chosen), None).iptables == "nft"
