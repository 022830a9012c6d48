"""Partial sync: what a change makes the iptables backend write (pure, no kernel)."""
# ruff: noqa: E501 - iptables-save lines are quoted whole

from __future__ import annotations

import pytest

from svcproxy.backends.iptables import names
from svcproxy.backends.iptables.apply import failing_lines
from svcproxy.backends.iptables.backend import IptablesBackend, IptablesOptions
from svcproxy.backends.iptables.cleanup import cleanup_text
from svcproxy.backends.iptables.jumps import JUMPS, insert_lines
from svcproxy.backends.iptables.render import FamilyConfig
from svcproxy.backends.iptables.render_plan import Plan, Planner, Rendered, render
from svcproxy.backends.iptables.render_restore import parse_save, restore_text
from svcproxy.model import Endpoint, Protocol, ServicePort, ServicePortKey, ServicePortState
from svcproxy.sdk import Applied, Changes, Delta, NodeConfig, NodeState
from tests.support.iptables_fakes import RecordingIptables, stand_in

CFG = FamilyConfig(if_local="-s 10.0.0.0/8", if_not_local="! -s 10.0.0.0/8")


def svc(i: int, *eps: str) -> ServicePortState:
    key = ServicePortKey("ns", f"svc{i}", "http", Protocol.TCP)
    port = ServicePort(key, cluster_ips=(f"172.30.0.{i}",), port=80, has_endpoints=bool(eps))
    return ServicePortState(port, {ip: Endpoint(ip, 8080, internal=True, external=True, cluster=True)
                                   for ip in eps})


def value(state: ServicePortState) -> Rendered:
    return render(state, (CFG,))


class Synced:
    """A planner and the SDK's applied state after a full sync of ``states``."""

    def __init__(self, *states: ServicePortState) -> None:
        self.planner = Planner(CFG)
        self.applied: Applied[ServicePortKey, Rendered] = Applied()
        values = {s.key: value(s) for s in states}
        self.applied.commit(Delta(True, values))
        self.planner.commit(self.planner.full(values))

    def plan(self, *changed: ServicePortState, full: bool = False) -> Plan:
        """The partial plan of the SDK's delta to ``changed`` (``full``: all there is)."""
        delta = self.applied.diff({s.key: value(s) for s in changed}, full=full)
        return self.planner.partial(self.applied, delta)


def written(plan: Plan, table: str = "nat") -> set[str]:
    return set(plan.tables[table].write)


def test_endpoint_change_rewrites_only_that_services_chains() -> None:
    a, b = svc(1, "10.1.0.1", "10.1.0.2"), svc(2, "10.2.0.1")
    synced = Synced(a, b)
    a2 = svc(1, "10.1.0.1", "10.1.0.3")
    plan = synced.plan(a2)
    old_sep = names.endpoint_chain(a.key, a.endpoints["10.1.0.2"])
    new_sep = names.endpoint_chain(a.key, a2.endpoints["10.1.0.3"])
    assert written(plan) == {names.SVC_PREFIX + names.service_hash(a.key), new_sep}
    assert plan.tables["nat"].delete == [old_sep]
    assert written(plan, "filter") == set()
    text = restore_text(plan.tables)
    assert "svc2" not in text and names.SERVICES not in text
    assert plan.written() == {"filter": 0, "nat": 5}  # KUBE-SVC (3 rules), one KUBE-SEP (2)


def test_nothing_changed_writes_nothing() -> None:
    a = svc(1, "10.1.0.1")
    plan = Synced(a).plan(svc(1, "10.1.0.1"))
    assert plan.empty() and restore_text(plan.tables) == ""


def test_new_service_adds_its_chains_and_rewrites_kube_services() -> None:
    a, b = svc(1, "10.1.0.1"), svc(2, "10.2.0.1")
    plan = Synced(a).plan(b)
    assert names.SERVICES in written(plan)
    assert plan.tables["nat"].write[names.SERVICES].count("cluster IP") == 2
    assert all("svc1" not in text for c, text in plan.tables["nat"].write.items()
               if c != names.SERVICES)


def test_a_service_gone_from_the_state_has_its_chains_deleted() -> None:
    a, b = svc(1, "10.1.0.1"), svc(2, "10.2.0.1")
    plan = Synced(a, b).plan(a, full=True)
    gone = names.SVC_PREFIX + names.service_hash(b.key)
    assert gone in plan.tables["nat"].delete
    assert "-X " + gone in restore_text(plan.tables)
    assert "172.30.0.2" not in plan.tables["nat"].write[names.SERVICES]


def test_losing_all_endpoints_moves_the_service_to_a_filter_reject() -> None:
    a = svc(1, "10.1.0.1")
    plan = Synced(a).plan(svc(1))
    assert "REJECT" in plan.tables["filter"].write[names.SERVICES]
    assert names.SVC_PREFIX + names.service_hash(a.key) in plan.tables["nat"].delete


def test_nothing_is_adopted_before_commit() -> None:
    a = svc(1, "10.1.0.1")
    synced = Synced(a)
    synced.plan(svc(1), full=True)
    again = synced.plan(svc(1), full=True)
    assert not again.empty() and "REJECT" in again.tables["filter"].write[names.SERVICES]


def test_full_plan_deletes_stale_service_chains_but_no_foreign_chain() -> None:
    a = svc(1, "10.1.0.1")
    existing = frozenset({"KUBE-SVC-STALE0000000000", "KUBE-SEP-STALE0000000000", "MY-CHAIN",
                          "DOCKER"})
    plan = Planner(CFG).full({a.key: value(a)}, existing)
    assert plan.full
    assert plan.tables["nat"].delete == ["KUBE-SEP-STALE0000000000", "KUBE-SVC-STALE0000000000"]


def test_crossing_the_large_cluster_threshold_rewrites_everything(
        monkeypatch: pytest.MonkeyPatch) -> None:
    stand_in(monkeypatch.setattr)
    be = IptablesBackend(NodeConfig("n", cluster_cidrs=("10.0.0.0/8",)),
                         IptablesOptions(mode="nft", families=(4,), localhost_nodeports=False))
    small = [svc(i, f"10.{i}.0.1") for i in range(1, 3)]
    first = NodeState("n", 1, None, {s.key: s for s in small})
    be.sync(first, Changes(full=True, reason="initial"))
    assert "ns/svc1:http -> 10.1.0.1" in RecordingIptables.restored[-1]  # endpoint comments
    big = svc(3, *(f"10.3.{i // 250}.{i % 250 + 1}" for i in range(1000)))
    be.sync(NodeState("n", 2, None, {s.key: s for s in [*small, big]}),
            Changes(frozenset({big.key})))
    assert [r.full for r in be.reports] == [True]
    text = RecordingIptables.restored[-1]
    assert names.SVC_PREFIX + names.service_hash(small[0].key) in text
    assert "ns/svc1:http -> 10.1.0.1" not in text  # no endpoint comments above 1,000


SAVED = """# Generated by iptables-save
*filter
:INPUT ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:KUBE-SERVICES - [0:0]
:KUBE-FORWARD - [0:0]
:KUBE-PROXY-CANARY - [0:0]
:MY-CHAIN - [0:0]
-A INPUT -j MY-CHAIN
-A FORWARD -m comment --comment "kubernetes forwarding rules" -j KUBE-FORWARD
-A OUTPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A MY-CHAIN -s 1.2.3.4/32 -j ACCEPT
COMMIT
*nat
:PREROUTING ACCEPT [0:0]
:KUBE-SERVICES - [0:0]
:KUBE-SVC-ABC - [0:0]
:DOCKER - [0:0]
-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A PREROUTING -j DOCKER
COMMIT
"""


def test_cleanup_removes_our_jumps_and_chains_and_nothing_else() -> None:
    text = cleanup_text(parse_save(SAVED))
    lines = text.splitlines()
    assert "-D OUTPUT -m conntrack --ctstate NEW -m comment --comment \"kubernetes service " \
           "portals\" -j KUBE-SERVICES" in lines
    assert '-D PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES' \
        in lines
    deleted = {line.split()[1] for line in lines if line.startswith("-X ")}
    assert deleted == {"KUBE-SERVICES", "KUBE-FORWARD", "KUBE-PROXY-CANARY", "KUBE-SVC-ABC"}
    assert "MY-CHAIN" not in text and "DOCKER" not in text


def test_cleanup_keeps_kube_firewall_when_kubelet_owns_it() -> None:
    saved = SAVED.replace(":MY-CHAIN - [0:0]", ":MY-CHAIN - [0:0]\n:KUBE-FIREWALL - [0:0]\n"
                          ":KUBE-KUBELET-CANARY - [0:0]")
    assert "KUBE-FIREWALL" not in cleanup_text(parse_save(saved))
    alone = SAVED.replace(":MY-CHAIN - [0:0]", ":MY-CHAIN - [0:0]\n:KUBE-FIREWALL - [0:0]")
    assert "-X KUBE-FIREWALL" in cleanup_text(parse_save(alone))


def test_cleanup_of_a_clean_node_is_empty() -> None:
    assert cleanup_text(parse_save("*filter\n:INPUT ACCEPT [0:0]\nCOMMIT\n")) == ""


def test_only_missing_jump_rules_are_inserted() -> None:
    saved = parse_save(SAVED)
    nat = insert_lines(JUMPS, "nat", saved["nat"])
    assert sorted(nat) == [
        '-I OUTPUT 1 -m comment --comment "kubernetes service portals" -j KUBE-SERVICES',
        '-I POSTROUTING 1 -m comment --comment "kubernetes postrouting rules" '
        "-j KUBE-POSTROUTING",
    ]
    assert not any("FORWARD 1 -m comment --comment \"kubernetes forwarding rules\"" in line
                   for line in insert_lines(JUMPS, "filter", saved["filter"]))


def test_restore_errors_show_the_failing_line() -> None:
    text = "*nat\n:A - [0:0]\n-A A -j NOPE\nCOMMIT\n"
    shown = failing_lines(text, "iptables-restore: line 3 failed")
    assert "3: -A A -j NOPE" in shown


def test_big_nft_transactions_start_with_a_chainless_line() -> None:
    from svcproxy.backends.iptables.render_restore import (
        LIST_LINE,
        ZERO_LINE,
        AllChains,
        TableChanges,
        all_chains_options,
    )

    many = TableChanges(write={f"KUBE-SEP-{n}": f"-A KUBE-SEP-{n} -j RETURN\n" for n in range(3)},
                        lines=["-I PREROUTING 1 -j KUBE-SERVICES"])
    assert restore_text({"nat": many}, {"nat": AllChains(2)}).startswith(
        f"*nat\n{LIST_LINE}\n:KUBE-SEP-0 ")
    assert f"\n{LIST_LINE}\n" not in restore_text({"nat": many}, {"nat": AllChains(3)})
    assert f"\n{LIST_LINE}\n" not in restore_text({"nat": many})  # legacy mode
    # -S, unless an -I line goes into a built-in chain not there yet: then -Z
    present = {"nat": frozenset({"PREROUTING"})}
    assert all_chains_options({"nat": many}, {}, present)["nat"].line == LIST_LINE
    assert all_chains_options({"nat": many}, {}, {"nat": frozenset()})["nat"].line == ZERO_LINE
    zero = {"nat": AllChains(2, ZERO_LINE)}
    assert restore_text({"nat": many}, zero).startswith(f"*nat\n{ZERO_LINE}\n")
    many.lines.append("-D PREROUTING -j KUBE-SERVICES")  # needs the rule cache: -Z would
    assert f"\n{ZERO_LINE}\n" not in restore_text({"nat": many}, zero)  # zero all rules


def test_the_one_dump_is_chosen_against_the_size_of_the_table() -> None:
    from svcproxy.backends.iptables.render_restore import TableChanges, all_chains_options

    tables = {"nat": TableChanges(), "filter": TableChanges()}
    # 4,000 chains into a 110,000-chain table: the list (0.2 s) beats the dump (2.5 s)
    assert all_chains_options(tables, {"nat": 110_000})["nat"].above > 4_000
    # a first sync: nothing to dump, so the dump above the minimum
    assert {t: o.above for t, o in all_chains_options(tables, {}).items()} == {
        "nat": 500, "filter": 500}


def test_nft_cleanup_of_many_chains_deletes_jumps_first() -> None:
    from svcproxy.backends.iptables.cleanup import cleanup_texts

    saved = parse_save(SAVED)
    assert cleanup_texts(saved) == [cleanup_text(saved)]
    jumps, chains = cleanup_texts(saved, 0)  # nft mode, any table size
    assert "-D " in jumps and "-X " not in jumps
    assert "-D " not in chains and "\n-S\n" in chains and "-X KUBE-SERVICES" in chains
