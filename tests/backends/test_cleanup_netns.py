"""``--cleanup`` in a network namespace this test creates.

``svcproxy backend iptables --cleanup`` (the real process): kube-proxy's nfacct counters,
made by the backend's sync, are removed with its rules (nfacct objects are per
namespace); someone else's object stays, and so does a counter someone else's rule still
references. The ipvs backend's cleanup removes its rules in either iptables mode (its
syncs write in the node's mode, legacy included)."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator

import pytest

from svcproxy.backends.iptables.backend import IptablesBackend, IptablesOptions
from svcproxy.backends.iptables.nfacct import COUNTERS, INVALID_DROPPED, LOCALHOST_NODEPORTS, Nfacct
from svcproxy.backends.ipvs import apply
from svcproxy.backends.ipvs import ipsets as S
from svcproxy.backends.ipvs import names as N
from svcproxy.backends.ipvs import rules as R
from svcproxy.backends.ipvs.backend import IpvsBackend
from svcproxy.backends.ipvs.options import IpvsOptions
from svcproxy.sdk.backend import Changes, NodeState
from svcproxy.sdk.config import NodeConfig
from tests.support.lab.netns import call_in
from tests.support.lab.processes import SVCPROXY
from tests.support.netns.harness import missing_requirements, scratch_netns

pytestmark = pytest.mark.netns
FOREIGN = "someone_elses_pkts"


@pytest.fixture
def ns() -> Iterator[str]:
    why = missing_requirements() or ("" if shutil.which("iptables-nft-restore")
                                     else "needs iptables-nft-restore")
    if why:
        pytest.skip(why)
    with scratch_netns("spclean") as name:
        try:
            Nfacct(("ip", "netns", "exec", name)).names()
        except OSError as err:
            pytest.skip(f"no nfnetlink_acct in this kernel: {err}")
        yield name


def _prefix(ns: str) -> tuple[str, ...]:
    return ("ip", "netns", "exec", ns)


def _synced(ns: str) -> None:
    """The backend's first sync (no services): its top-level rules and its counters."""
    backend = IptablesBackend(NodeConfig(node_name="node1", node_ips=("192.168.50.1",)),
                              IptablesOptions(prefix=_prefix(ns), families=(4,)))
    backend.sync(NodeState("node1", 1, None, {}), Changes(full=True, reason="initial"))
    save = subprocess.run([*_prefix(ns), "iptables-save"], capture_output=True, text=True,
                          check=True).stdout
    assert INVALID_DROPPED in save  # (iptables-save prints "--nfacct-name  NAME")


def _cleanup(ns: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([*_prefix(ns), *SVCPROXY, "backend", "iptables", "--cleanup",
                           "--node-name", "node1"], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "SVCPROXY_API": ""})
    assert done.returncode == 0, done.stderr
    return done


def test_cleanup_removes_the_nfacct_counters_and_nothing_else(ns: str) -> None:
    nfacct = Nfacct(_prefix(ns))
    nfacct.create(FOREIGN)
    _synced(ns)
    assert set(nfacct.names()) == {FOREIGN, *COUNTERS}
    _cleanup(ns)
    assert nfacct.names() == [FOREIGN]
    save = subprocess.run([*_prefix(ns), "iptables-save"], capture_output=True, text=True,
                          check=True).stdout
    assert "KUBE-" not in save and "nfacct" not in save


def test_a_counter_someone_elses_rule_references_is_left(ns: str) -> None:
    _synced(ns)
    subprocess.run([*_prefix(ns), "iptables", "-A", "INPUT", "-m", "nfacct", "--nfacct-name",
                    LOCALHOST_NODEPORTS], check=True)
    done = _cleanup(ns)
    assert Nfacct(_prefix(ns)).names() == [LOCALHOST_NODEPORTS]
    assert f"nfacct counter {LOCALHOST_NODEPORTS} left" in done.stderr


def _ipvs_rules_then_cleanup(mode: str) -> str:
    """The ipvs backend's fixed rules written in ``mode`` (as its sync does on a node in
    that mode), then its cleanup; what is left in that mode."""
    apply.ipset_restore(S.full_restore({}, (4,)))
    local = R.LocalDetect(cidrs=("10.244.0.0/16",))
    tables = {"nat": R.nat_rules(4, False, local), "filter": R.filter_rules(4),
              "mangle": R.mangle_rules(4, local)}
    apply.iptables_restore(4, R.restore_text(tables, list(R.JUMPS)), mode)
    assert "KUBE-SERVICES" in apply.iptables_save(4, "nat", mode)
    IpvsBackend(NodeConfig(node_name="node1"), IpvsOptions(), (4,)).cleanup()
    return "".join(apply.iptables_save(4, t, mode) for t in N.TABLES)


@pytest.mark.parametrize("mode", ["nft", "legacy"])
def test_ipvs_cleanup_removes_its_rules_in_either_iptables_mode(ns: str, mode: str) -> None:
    if shutil.which(f"iptables-{mode}-restore") is None:
        pytest.skip(f"needs iptables-{mode}-restore")
    assert "KUBE-" not in call_in(ns, _ipvs_rules_then_cleanup, mode)
