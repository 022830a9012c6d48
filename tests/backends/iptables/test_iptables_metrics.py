"""kube-proxy's iptables-mode metrics, exported through the agent's /metrics (no kernel)."""

from __future__ import annotations

import http.client
import re
from collections.abc import Iterator

import pytest

from svcproxy.backends.iptables import backend as backend_module
from svcproxy.backends.iptables.apply import IptablesError
from svcproxy.backends.iptables.backend import IptablesBackend, IptablesOptions
from svcproxy.model import Endpoint, Protocol, ServicePort, ServicePortKey, ServicePortState
from svcproxy.sdk.backend import Changes, NodeState
from svcproxy.sdk.config import NodeConfig
from svcproxy.sdk.node_agent import NodeAgent
from svcproxy.sdk.testing import FakeSource
from tests.support.iptables_fakes import FakeNfacct, RecordingIptables, stand_in

KEY = ServicePortKey("default", "web", "http", Protocol.TCP)


@pytest.fixture
def agent(monkeypatch: pytest.MonkeyPatch) -> Iterator[NodeAgent]:
    monkeypatch.setattr(backend_module, "Nfacct", FakeNfacct)
    backend = agent_backend(monkeypatch)
    node_agent = NodeAgent(FakeSource(), backend, backend.config,
                           metrics_address=("127.0.0.1", 0))
    yield node_agent
    node_agent.close()


def agent_backend(monkeypatch: pytest.MonkeyPatch) -> IptablesBackend:
    """The backend with the iptables programs and sysctls faked (nfacct: as patched)."""
    nfacct = backend_module.Nfacct  # as the test patched it
    stand_in(monkeypatch.setattr, nfacct)
    config = NodeConfig("node-a", cluster_cidrs=("10.0.0.0/8",))
    return IptablesBackend(config, IptablesOptions(mode="nft", families=(4,),
                                                   localhost_nodeports=False))


def state(revision: int, *ips: str) -> NodeState:
    port = ServicePort(KEY, cluster_ips=("172.30.0.1",), port=80, has_endpoints=bool(ips))
    eps = {ip: Endpoint(ip, 8080, internal=True, external=True, cluster=True) for ip in ips}
    return NodeState("node-a", revision, None, {KEY: ServicePortState(port, eps)})


def metric(node_agent: NodeAgent, name: str, labels: str = "") -> float:
    assert node_agent.metrics_server is not None
    conn = http.client.HTTPConnection("127.0.0.1", node_agent.metrics_server.port, timeout=5)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    found = re.search(rf"^{re.escape(name)}{re.escape(labels)} (\S+)$", text, re.MULTILINE)
    assert found, f"{name}{labels} not in /metrics"
    return float(found.group(1))


def sync(node_agent: NodeAgent, new: NodeState, changes: Changes) -> None:
    """One sync as the runner does it: the backend, then the agent's bookkeeping."""
    node_agent.runner._backend.sync(new, changes)
    node_agent.metrics.synced(None, new, changes.services, changes.full, 0.01, ())


TOTAL = "kubeproxy_sync_proxy_rules_iptables_total"
LAST = "kubeproxy_sync_proxy_rules_iptables_last"
NAT, FILTER = '{ip_family="IPv4",table="nat"}', '{ip_family="IPv4",table="filter"}'
V4 = '{ip_family="IPv4"}'


def rule_lines(text: str, table: str) -> int:
    """-A lines of one table in an iptables-restore input."""
    if f"*{table}\n" not in text:
        return 0
    body = text.split(f"*{table}\n", 1)[1].split("COMMIT", 1)[0]
    return sum(1 for line in body.splitlines() if line.startswith(("-A ", "-I ")))


def test_rule_counts_per_table_follow_full_and_partial_syncs(agent: NodeAgent) -> None:
    sync(agent, state(1, "10.1.0.1", "10.1.0.2"), Changes(full=True, reason="initial"))
    nat = metric(agent, TOTAL, NAT)
    full_text = RecordingIptables.restored[-1]
    assert nat == sum(1 for line in full_text.split("*nat\n", 1)[1].split("COMMIT", 1)[0]
                      .splitlines() if line.startswith("-A "))
    assert metric(agent, TOTAL, FILTER) > 0
    # iptables_last: what the sync wrote (the full one: everything, jump rules included)
    assert metric(agent, LAST, NAT) == rule_lines(full_text, "nat") >= nat
    assert metric(agent, LAST, FILTER) == rule_lines(full_text, "filter") > 0
    sync(agent, state(2, "10.1.0.1"), Changes(services=frozenset({KEY})))
    # one KUBE-SEP chain (2 rules) and one probability rule fewer
    assert metric(agent, TOTAL, NAT) == nat - 3
    # the partial sync rewrote the KUBE-SVC chain only: its masquerade rule and one jump
    assert metric(agent, LAST, NAT) == rule_lines(RecordingIptables.restored[-1], "nat") == 2
    assert metric(agent, LAST, FILTER) == 0


def test_restore_failures_are_counted_partial_ones_apart(agent: NodeAgent) -> None:
    name = "kubeproxy_sync_proxy_rules_iptables_restore_failures_total"
    partial = "kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total"
    assert metric(agent, name, V4) == 0 and metric(agent, partial, V4) == 0
    sync(agent, state(1, "10.1.0.1"), Changes(full=True, reason="initial"))
    RecordingIptables.fail = 1  # the partial restore fails; the full one it falls back to works
    sync(agent, state(2, "10.1.0.2"), Changes(services=frozenset({KEY})))
    assert metric(agent, name, V4) == 1 and metric(agent, partial, V4) == 1
    RecordingIptables.fail = 1  # a full restore that fails once is tried once more
    sync(agent, state(3, "10.1.0.3"), Changes(full=True, reason="retry"))
    assert metric(agent, name, V4) == 2 and metric(agent, partial, V4) == 1
    RecordingIptables.fail = 100  # every restore fails: the node's fault, not the service's
    with pytest.raises(IptablesError):
        sync(agent, state(4, "10.1.0.4"), Changes(full=True, reason="retry"))
    assert metric(agent, name, V4) > 3 and metric(agent, partial, V4) == 1
    assert not agent.runner._backend.refusals  # type: ignore[attr-defined]


def test_full_and_partial_durations_count_what_the_backend_did(agent: NodeAgent) -> None:
    full = "kubeproxy_sync_full_proxy_rules_duration_seconds_count"
    partial = "kubeproxy_sync_partial_proxy_rules_duration_seconds_count"
    v4 = '{ip_family="IPv4"}'
    sync(agent, state(1, "10.1.0.1"), Changes(full=True, reason="initial"))
    assert metric(agent, full, v4) == 1 and metric(agent, partial, v4) == 0
    # the agent's periodic sync asks for everything; the backend finds nothing to rewrite
    periodic = Changes(services=frozenset({KEY}), full=True, reason="periodic")
    sync(agent, state(1, "10.1.0.1"), periodic)
    assert metric(agent, full, v4) == 1 and metric(agent, partial, v4) == 1


def test_without_nfacct_the_rules_count_nothing_and_the_counters_are_left_out(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    class NoNfacct(FakeNfacct):
        def create(self, name: str) -> None:
            raise FileNotFoundError(2, "No such file or directory")

    monkeypatch.setattr(backend_module, "Nfacct", NoNfacct)
    backend = agent_backend(monkeypatch)
    node_agent = NodeAgent(FakeSource(), backend, backend.config,
                           metrics_address=("127.0.0.1", 0))
    try:
        sync(node_agent, state(1, "10.1.0.1"), Changes(full=True, reason="initial"))
        text = RecordingIptables.restored[-1]
        assert "KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP" in text
        assert "nfacct" not in text
        assert metric(node_agent, TOTAL, NAT) > 0
        with pytest.raises(AssertionError):
            metric(node_agent, "kubeproxy_iptables_ct_state_invalid_dropped_packets_total")
        assert any("Cannot create the nfacct counters" in r.getMessage() for r in caplog.records)
    finally:
        node_agent.close()


def test_with_nfacct_the_invalid_drop_is_counted(agent: NodeAgent) -> None:
    sync(agent, state(1, "10.1.0.1"), Changes(full=True, reason="initial"))
    assert ("KUBE-FORWARD -m conntrack --ctstate INVALID -m nfacct --nfacct-name "
            "ct_state_invalid_dropped_pkts -j DROP") in RecordingIptables.restored[-1]
    assert metric(agent, "kubeproxy_iptables_ct_state_invalid_dropped_packets_total") == 0
