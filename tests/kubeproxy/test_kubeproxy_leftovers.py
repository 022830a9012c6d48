"""Other modes' leftovers removed as kube-proxy removes them: what kube-proxy's nftables and
iptables modes left (and svcproxy's nft table) is gone after --init-only or --cleanup, in a
network namespace this test creates with those leftovers in it."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from svcproxy.kubeproxy.leftovers import leftover_backends, remove_kube_proxy_tables
from tests.support.lab.topology import Namespaces

CONFIG = ("apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n"
          "mode: {mode}\nclusterCIDR: 10.244.0.0/16\nconntrack: {{maxPerCore: 0}}\n")
LEFTOVERS = (
    ["nft", "add", "table", "ip", "kube-proxy"],
    ["nft", "add", "chain", "ip", "kube-proxy", "services"],
    ["nft", "add", "table", "ip6", "kube-proxy"],
    ["nft", "add", "table", "ip", "svcproxy"],
    ["iptables-nft", "-t", "nat", "-N", "KUBE-SERVICES"],
    ["iptables-nft", "-t", "nat", "-A", "PREROUTING", "-j", "KUBE-SERVICES"],
    ["iptables-nft", "-t", "nat", "-N", "KUBE-SVC-ABCDEFGHIJKLMNOP"],
)


def test_which_modes_are_cleaned_up_before_which() -> None:
    assert leftover_backends("nft", False) == ["iptables", "ipvs"]
    assert leftover_backends("ebpf", False) == ["iptables", "ipvs"]
    assert leftover_backends("iptables", False) == ["nft"]
    assert leftover_backends("ipvs", False) == ["nft"]
    assert leftover_backends("iptables", True) == ["ipvs", "nft"]
    assert leftover_backends("some-plugin", False) == []


def test_kube_proxys_tables_are_deleted_only_when_present() -> None:
    calls: list[list[str]] = []

    def run(argv: list[str], **_: object) -> subprocess.CompletedProcess[str]:
        calls.append(argv)
        present = argv[1] == "delete" or argv[3] == "ip"
        return subprocess.CompletedProcess(argv, 0 if present else 1, "", "")

    assert remove_kube_proxy_tables(run) == ["ip kube-proxy"]
    assert [c[1] for c in calls] == ["list", "delete", "list"]


@pytest.fixture
def netns() -> Iterator[str]:
    if os.geteuid() != 0:
        pytest.skip("needs root for a network namespace")
    namespaces = Namespaces()
    try:
        yield namespaces.add_ns("left")
    finally:
        namespaces.destroy()


def _in(ns: str, *cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", "netns", "exec", ns, *cmd], capture_output=True, text=True,
                          timeout=120)


def _leave(ns: str) -> None:
    for argv in LEFTOVERS:
        proc = _in(ns, *argv)
        if proc.returncode != 0:
            pytest.skip(f"cannot make leftovers: {' '.join(argv)}: {proc.stderr.strip()}")


def _tables(ns: str) -> str:
    return _in(ns, "nft", "list", "tables").stdout


@pytest.mark.parametrize(("mode", "flag", "svcproxy_table_stays"), [
    ("nftables", "--init-only", True),  # nft's own table is the mode's, not a leftover
    ("iptables", "--cleanup", False),
])
def test_leftovers_of_other_modes_are_removed(netns: str, tmp_path: Path, mode: str, flag: str,
                                              svcproxy_table_stays: bool) -> None:
    _leave(netns)
    conf = tmp_path / "config.conf"
    conf.write_text(CONFIG.format(mode=mode))
    proc = _in(netns, sys.executable, "-m", "svcproxy.cli", "backend", f"--config={conf}",
               "--hostname-override=node-a", flag)
    assert proc.returncode == 0, proc.stderr
    assert "kube-proxy" not in _tables(netns)
    assert ("ip svcproxy" in _tables(netns)) is svcproxy_table_stays
    assert "KUBE-S" not in _in(netns, "iptables-nft", "-t", "nat", "-S").stdout
    assert "Removed kube-proxy's nftables table ip kube-proxy" in proc.stderr
