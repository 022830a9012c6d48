"""The guard around every test (tests/conftest.py): a changed root-namespace sysctl is found
and put back. Checked on a stand-in /proc/sys tree, never on the machine's own."""

from __future__ import annotations

from pathlib import Path

from svcproxy.kubeproxy.config import load_config
from svcproxy.kubeproxy.sysctls import wanted_sysctls
from svcproxy.sdk.sysctls import mode_sysctls
from tests.support import root_sysctls


def test_a_changed_sysctl_is_found_and_put_back(tmp_path: Path) -> None:
    for name, value in (("net/ipv4/ip_forward", "0"), ("net/ipv4/icmp_ratelimit", "1000")):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(value + "\n")
    before = root_sysctls.read(tmp_path)
    assert before == {"net/ipv4/ip_forward": "0", "net/ipv4/icmp_ratelimit": "1000"}
    assert root_sysctls.changed(before, root_sysctls.read(tmp_path)) == {}

    (tmp_path / "net/ipv4/ip_forward").write_text("1\n")
    diff = root_sysctls.changed(before, root_sysctls.read(tmp_path))
    assert diff == {"net/ipv4/ip_forward": ("0", "1")}
    root_sysctls.restore(diff, tmp_path)
    assert root_sysctls.read(tmp_path) == before


def test_the_backends_sysctls_are_watched() -> None:
    config = load_config("apiVersion: kubeproxy.config.k8s.io/v1alpha1\n"
                         "kind: KubeProxyConfiguration\nconntrack: {tcpBeLiberal: true, "
                         "udpTimeout: 30s, udpStreamTimeout: 2m}\nipvs: {strictARP: true}\n")
    wanted = {n for mode in ("iptables", "ipvs", "nft")
              for n in wanted_sysctls(config, mode, 2, (4, 6))}
    wanted |= {n for mode in ("iptables", "ipvs", "nftables")
               for n in mode_sysctls(mode, (4, 6), localhost_nodeports=True, strict_arp=True)}
    assert wanted <= set(root_sysctls.WATCHED), wanted - set(root_sysctls.WATCHED)
