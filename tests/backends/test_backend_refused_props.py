"""Hostile names and values against the renderers (hypothesis), and the bisection.

Any Service name (quotes, semicolons, newlines, braces, non-ASCII, 300 characters)
and any value reaching a rule either renders into text the real tools and kernel take
(nft in a namespace this module makes; iptables-restore in nft mode there) or, for a
value that is not what its field holds, refuses that one service port up front. The
others are always programmed.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from svcproxy.backends.iptables import names as ipt_names
from svcproxy.backends.iptables.backend import IptablesBackend, IptablesOptions
from svcproxy.backends.ipvs.backend import IpvsBackend
from svcproxy.backends.ipvs.options import IpvsOptions
from svcproxy.backends.nft import names as nft_names
from svcproxy.backends.nft.apply import NftRunner
from svcproxy.backends.nft.backend import NftBackend
from svcproxy.model import (
    Endpoint,
    NodeInfo,
    Protocol,
    ServicePort,
    ServicePortKey,
    ServicePortState,
    ServiceType,
    SessionAffinity,
)
from svcproxy.sdk import Changes, NodeState
from svcproxy.sdk.config import NodeConfig
from svcproxy.sdk.refusals import Refusals, invalid_values, isolate, isolate_versions
from tests.support.ipvs.standin import stand_in
from tests.support.lab.netns import ns_exec
from tests.support.netns.harness import netns_or_skip

CONFIG = NodeConfig("node1", cluster_cidrs=("10.244.0.0/16",), node_ips=("192.168.50.2",),
                    service_cidrs=("10.96.0.0/16",))
ADVERSARIAL = ['"', "'", ";", "\n", "}", "{", "\\", "#", "a b", "é", "\x00", "-j ACCEPT",
               '" ; flush ruleset ; "', "*nat\nCOMMIT\n", "x" * 300, "ns/name", "..", "-",
               "\u202e", "\U0001f600", "$(reboot)", "%s", ""]
BAD_IPS = ["10.0.0.1 } ; flush ruleset", "1.2.3.4\n", "999.1.1.1", "fe80::1%eth0;x", "",
           "10.0.0.01", "abc", "fd00::g", "1.2.3.4/32"]
BAD_PORTS = [-1, 0, 65536, 2**31 - 1]

names = st.one_of(st.sampled_from(ADVERSARIAL), st.text(max_size=300),
                  st.lists(st.sampled_from(ADVERSARIAL), max_size=4).map("".join))


@dataclass(frozen=True)
class Case:
    """One service port; ``bad`` says which of its values (if any) is not valid."""

    key: ServicePortKey
    record: ServicePortState
    bad: bool


@st.composite
def cases(draw: st.DrawFn, index: int) -> Case:
    key = ServicePortKey(draw(names), draw(names), draw(names), draw(st.sampled_from(Protocol)))
    cip = f"10.96.5.{index + 1}"
    ep_ip, port, ep_port = f"10.244.1.{index + 1}", 80, 8080
    flaw = draw(st.sampled_from(["", "", "", "cip", "ep", "port", "ep_port", "timeout"]))
    if flaw == "cip":
        cip = draw(st.sampled_from(BAD_IPS))
    elif flaw == "ep":
        ep_ip = draw(st.sampled_from(BAD_IPS))
    elif flaw == "port":
        port = draw(st.sampled_from(BAD_PORTS))
    elif flaw == "ep_port":
        ep_port = draw(st.sampled_from([-1, 65536]))
    affinity = draw(st.booleans())
    timeout = draw(st.sampled_from([-5, 86401, 2**31 - 1])) if flaw == "timeout" else 60
    svc = ServicePort(key, type=ServiceType.NODE_PORT, cluster_ips=(cip,), port=port,
                      node_port=30000 + index, has_endpoints=True,
                      session_affinity=SessionAffinity.CLIENT_IP if affinity
                      else SessionAffinity.NONE,
                      session_affinity_timeout=timeout if affinity or flaw == "timeout" else 0)
    ep = Endpoint(ep_ip, ep_port, internal=True, external=True, cluster=True)
    return Case(key, ServicePortState(svc, {ep_ip: ep}), bool(flaw))


@st.composite
def states(draw: st.DrawFn) -> tuple[NodeState, list[Case]]:
    drawn = [draw(cases(i)) for i in range(draw(st.integers(1, 4)))]
    unique = list({c.key: c for c in drawn}.values())
    canary = ServicePortKey("canary", "ok", "http", Protocol.TCP)
    svc = ServicePort(canary, cluster_ips=("10.96.6.1",), port=80, has_endpoints=True)
    ep = Endpoint("10.244.2.1", 8080, internal=True, external=True, cluster=True)
    unique.append(Case(canary, ServicePortState(svc, {ep.ip: ep}), False))
    node = NodeInfo("node1", pod_cidrs=(draw(st.sampled_from(["10.244.1.0/24", *BAD_IPS])),))
    return NodeState("node1", 1, node, {c.key: c.record for c in unique}), unique




@pytest.fixture(scope="module")
def netns() -> Iterator[str]:
    with netns_or_skip("sphostile") as name:
        yield name


def full(state: NodeState) -> Changes:
    return Changes(frozenset(state.services), full=True, reason="initial")


@pytest.mark.netns
@settings(max_examples=30, deadline=None, suppress_health_check=[
    HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(drawn=states())
def test_nft_programs_every_valid_service_whatever_the_names(
        netns: str, drawn: tuple[NodeState, list[Case]]) -> None:
    state, drawn_cases = drawn
    backend = NftBackend(CONFIG, NftRunner(("ip", "netns", "exec", netns)), families=(4,))
    backend.sync(state, full(state))
    assert set(backend.refusals) == {c.key for c in drawn_cases if c.bad}
    table = ns_exec(netns, "nft", "list", "table", "ip", nft_names.TABLE)
    for case in drawn_cases:
        cip = re.escape(case.record.service.cluster_ips[0])
        element = rf"(?<![\d.]){cip} \. {case.key.protocol.value.lower()} \. 80\b"
        assert bool(re.search(element, table)) != case.bad
    # A delta moving every endpoint to another port loads too (bad ports stay bad).
    moved = {k: ServicePortState(r.service, {
        ip: Endpoint(ip, e.port + 1 if 0 < e.port < 65535 else e.port, internal=True,
                     external=True, cluster=True) for ip, e in r.endpoints.items()})
        for k, r in state.services.items()}
    after = NodeState("node1", 2, state.node, moved)
    backend.sync(after, Changes(frozenset(moved)))
    assert backend.last is not None and backend.last.mode == "delta"
    assert set(backend.refusals) == {c.key for c in drawn_cases if c.bad}


@pytest.mark.netns
@settings(max_examples=15, deadline=None, suppress_health_check=[
    HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(drawn=states())
def test_iptables_programs_every_valid_service_whatever_the_names(
        netns: str, drawn: tuple[NodeState, list[Case]]) -> None:
    state, drawn_cases = drawn
    backend = IptablesBackend(CONFIG, IptablesOptions(
        mode="nft", families=(4,), localhost_nodeports=False,
        prefix=("ip", "netns", "exec", netns)))
    backend.sync(state, full(state))
    assert set(backend.refusals) == {c.key for c in drawn_cases if c.bad}
    nat = ns_exec(netns, "iptables-nft-save", "-t", "nat")
    for case in drawn_cases:
        chain = ipt_names.SVC_PREFIX + ipt_names.service_hash(case.key)
        assert (f"-j {chain}" in nat) != case.bad


@settings(max_examples=200, deadline=None)
@given(st.builds(ServicePortKey, names, names, names, st.sampled_from(Protocol)))
def test_names_in_rules_hold_only_safe_characters(key: ServicePortKey) -> None:
    base = nft_names.service_base(key)
    assert re.fullmatch(r"[A-Z2-7]{8}-[A-Za-z0-9_.-]*/[A-Za-z0-9_.-]*/[a-z]+/[A-Za-z0-9_.-]*",
                        base) and len(base) <= 166
    comment = ipt_names.quote(ipt_names.port_name(key) + " cluster IP")
    inner = comment[1:-1] if comment.startswith('"') else comment
    assert re.fullmatch(r"[A-Za-z0-9 _.,:/>()\[\]=+@-]+", inner) and len(inner) <= 255


def test_valid_kubernetes_names_are_rendered_as_they_are() -> None:
    key = ServicePortKey("kube-system", "kube-dns.x", "dns-tcp", Protocol.TCP)
    assert nft_names.service_base(key).endswith("-kube-system/kube-dns.x/tcp/dns-tcp")
    assert ipt_names.quote("kube-system/kube-dns.x:dns-tcp cluster IP") == (
        '"kube-system/kube-dns.x:dns-tcp cluster IP"')


@given(drawn=states())
def test_ipvs_screens_exactly_the_invalid_values(drawn: tuple[NodeState, list[Case]]) -> None:
    """Through the SDK's screening (ipvs has no copy of it), on the in-memory kernel."""
    state, drawn_cases = drawn
    backend = IpvsBackend(CONFIG, IpvsOptions(), families=(4,))
    with pytest.MonkeyPatch.context() as patches:
        stand_in(backend, patches)
        backend.sync(state, full(state))
    assert set(state.services) - set(backend.applied) == {c.key for c in drawn_cases if c.bad}
    assert set(backend.refusals) == {c.key for c in drawn_cases if c.bad}


@given(st.integers(1, 60), st.data())
def test_isolate_finds_exactly_the_refused_items(n: int, data: st.DataObject) -> None:
    bad = data.draw(st.sets(st.integers(0, n - 1), max_size=n))
    tries: list[int] = []

    def accepts(accepted: list[int], group: list[int]) -> str | None:
        tries.append(1)
        culprits = sorted(bad & {*accepted, *group})
        return f"refused {culprits[0]}" if culprits else None

    items = list(range(n))
    error = accepts([], items)
    if error is None:
        return
    accepted, refused = isolate(items, accepts, error)
    assert sorted(accepted) == sorted(set(items) - bad)
    assert {i: e for i, e in refused} == {i: f"refused {i}" for i in bad}
    assert len(tries) <= 1 + 2 * len(bad) * max(1, n.bit_length())


def test_isolate_versions_falls_back_to_the_previous_version() -> None:
    records = {"a": "a2", "b": "b2-bad", "c": "c2-bad"}
    previous = {"a": "a1", "b": "b1", "c": "c1-bad"}

    def accepts(items: list[tuple[str, str]]) -> str | None:
        return "no" if any(v.endswith("-bad") for _, v in items) else None

    accepted, refused = isolate_versions(records, previous, accepts, "no")
    assert accepted == {"a": "a2", "b": "b1"}
    assert set(refused) == {"b", "c"}


def test_a_refusal_is_logged_once_per_version_and_cleared(caplog: pytest.LogCaptureFixture
                                                          ) -> None:
    refusals = Refusals("test")
    key = ServicePortKey("ns", "a\nb", "p", Protocol.TCP)
    record = ServicePortState(ServicePort(key, cluster_ips=("bad",), port=80))
    reason = invalid_values(record)
    assert reason is not None and "'bad'" in reason
    refusals.refuse(key, record, reason)
    refusals.refuse(key, record, reason)
    assert refusals.total == 1 and refusals.holds(key, record)
    assert "ns/a\\nb:p/TCP" in caplog.text and caplog.text.count("the dataplane refused") == 1
    refusals.prune(set())
    assert not refusals
