"""The root network namespace's sysctls that svcproxy or its tests could write.

Every test runs between two readings of them (tests/conftest.py): the backends, the lab
and kube-proxy's --init-only set these only inside namespaces the tests create, so a
difference means something wrote the machine's own (it is put back and the test fails).
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path("/proc/sys")
WATCHED = (
    "net/ipv4/ip_forward",
    "net/ipv6/conf/all/forwarding",
    "net/ipv6/conf/all/accept_dad",
    "net/ipv6/conf/default/accept_dad",
    "net/ipv4/conf/all/route_localnet",
    "net/ipv4/conf/all/arp_ignore",
    "net/ipv4/conf/all/arp_announce",
    "net/ipv4/icmp_ratelimit",
    "net/ipv6/icmp/ratelimit",
    "net/ipv4/vs/conntrack",
    "net/ipv4/vs/expire_nodest_conn",
    "net/ipv4/vs/expire_quiescent_template",
    "net/bridge/bridge-nf-call-iptables",
    "net/bridge/bridge-nf-call-ip6tables",
    "net/netfilter/nf_conntrack_max",
    "net/netfilter/nf_conntrack_tcp_timeout_established",
    "net/netfilter/nf_conntrack_tcp_timeout_close_wait",
    "net/netfilter/nf_conntrack_udp_timeout",
    "net/netfilter/nf_conntrack_udp_timeout_stream",
    "net/netfilter/nf_conntrack_tcp_be_liberal",
)


def read(root: Path = ROOT) -> dict[str, str]:
    """The watched sysctls that exist here, as read by the calling thread (the pytest main
    thread stays in the root namespace)."""
    values = {}
    for name in WATCHED:
        try:
            values[name] = (root / name).read_text().strip()
        except OSError:
            continue
    return values


def changed(before: dict[str, str], after: dict[str, str]) -> dict[str, tuple[str, str]]:
    """name -> (before, after) for each watched sysctl whose value differs."""
    return {n: (v, after.get(n, "<gone>")) for n, v in before.items() if after.get(n) != v}


def restore(diff: dict[str, tuple[str, str]], root: Path = ROOT) -> None:
    """Put the values back (best effort: one that cannot be written is left)."""
    for name, (value, _) in diff.items():
        try:
            (root / name).write_text(value)
        except OSError:
            continue
