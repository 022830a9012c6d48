"""The node agent resolves one node context and hands it to the backend with every state."""

from __future__ import annotations

import threading
import time
from dataclasses import replace

from svcproxy.agent.config import NodeConfig
from svcproxy.agent.health import ProxyHealth
from svcproxy.agent.node_context import ContextResolver
from svcproxy.agent.runner import SyncRunner
from svcproxy.model import NodeInfo, Protocol, ServicePortKey
from svcproxy.sdk import resolve_context
from svcproxy.sdk.backend import Backend, Changes, NodeState
from svcproxy.sdk.testing import FakeSource

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
    import io
    import json

    from svcproxy.agent.node_agent import NodeAgent
    from svcproxy.backends.dump.backend import DumpBackend

    out = io.StringIO()
    source = FakeSource()
    agent = NodeAgent(source, DumpBackend(out), CONFIG, health_check_node_ports=False,
                      poll=0.02)
    thread = threading.Thread(target=agent.run, daemon=True)
    thread.start()
    try:
        source.push(NodeState("node1", 1, NodeInfo("node1", pod_cidrs=("10.244.3.0/24",)), {}),
                    [KEY])
        deadline = time.monotonic() + 5
        while not out.getvalue() and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        agent.stop()
        thread.join(5)
        agent.close()
    line = json.loads(out.getvalue().splitlines()[0])
    v4 = line["context"]["families"][0]
    assert v4["node_ips"] == ["192.168.50.2"]
    assert v4["local_traffic"] == {"mode": "NodeCIDR", "cidrs": ["10.244.3.0/24"],
                                   "interface": ""}
    assert agent.context(None).family(4).node_ips == ("192.168.50.2",)
