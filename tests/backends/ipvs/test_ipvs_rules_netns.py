"""The ipsets and fixed iptables rules against the real kernel (host, own netns):
they load, stay the same size, and --cleanup removes them and nothing else."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from svcproxy.backends.ipvs import apply
from svcproxy.backends.ipvs import ipsets as S
from svcproxy.backends.ipvs import names as N
from svcproxy.backends.ipvs import rules as R
from svcproxy.backends.ipvs.backend import IpvsBackend
from svcproxy.backends.ipvs.options import IpvsOptions
from svcproxy.sdk.config import NodeConfig
from tests.support.lab.netns import call_in
from tests.support.netns.harness import netns_or_skip

pytestmark = pytest.mark.netns


@pytest.fixture
def ns() -> Iterator[str]:
    with netns_or_skip("ivs") as name:
        yield name


def _load(entries: dict[str, set[str]]) -> int:
    apply.ipset_restore(S.full_restore(entries, (4,)))
    local = R.LocalDetect(cidrs=("10.244.0.0/16",))
    tables = {"nat": R.nat_rules(4, False, local), "filter": R.filter_rules(4),
              "mangle": R.mangle_rules(4, local)}
    saved = {t: apply.iptables_save(4, t) for t in N.TABLES}
    missing = [j for j in R.JUMPS if j.rule() not in saved[j.table] and j.table in tables]
    apply.iptables_restore(4, R.restore_text(tables, missing))
    chains = N.NAT_CHAINS + N.FILTER_CHAINS + N.MANGLE_CHAINS
    return sum(R.count_rules(apply.iptables_save(4, t), chains) for t in N.TABLES)


def _cleanup_leaves_foreign_things() -> tuple[str, set[str]]:
    apply.run(["iptables", "-t", "nat", "-N", "FOREIGN"])
    apply.run(["ipset", "create", "FOREIGN-SET", "hash:ip"])
    IpvsBackend(NodeConfig(node_name="n1"), IpvsOptions(), (4,)).cleanup()
    saved = "".join(apply.iptables_save(4, t) for t in N.TABLES)
    return saved, apply.ipset_names()


def test_rules_load_stay_fixed_and_cleanup_removes_only_ours(ns: str) -> None:
    few = {"KUBE-CLUSTER-IP": {f"10.96.0.{i},tcp:80" for i in range(1, 11)}}
    many = {"KUBE-CLUSTER-IP": {f"10.96.{i // 250}.{i % 250 + 1},tcp:80" for i in range(1000)},
            "KUBE-NODE-PORT-TCP": {str(30000 + i) for i in range(1000)}}
    small = call_in(ns, _load, few)
    assert small == call_in(ns, _load, many), "reloading with more services adds no rule"
    saved, sets = call_in(ns, _cleanup_leaves_foreign_things)
    assert "KUBE-" not in saved and ":FOREIGN" in saved
    assert sets == {"FOREIGN-SET"}
