"""The node context: node IPs, NodePort addresses, local-traffic detection, resolved once."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given
from hypothesis import strategies as st

from svcproxy.sdk import NodeConfig, NodeInfo
from svcproxy.sdk.context import LocalTraffic, interface_addresses, resolve_context
from tests.support.paths import REPO

IPS = ("10.1.1.1", "192.168.1.5", "fd00::5", "fd00::6")


def config(**kw: object) -> NodeConfig:
    return NodeConfig(node_name="node-a", **{"node_ips": IPS, **kw})  # type: ignore[arg-type]


def test_node_ips_per_family_primary_first_else_the_node_objects() -> None:
    ctx = resolve_context(config(), None)
    assert ctx.family(4).node_ips == ("10.1.1.1", "192.168.1.5")
    assert ctx.family(6).primary_ip == "fd00::5"
    node = NodeInfo("node-a", addresses=("172.16.0.9",))
    from_node = resolve_context(config(node_ips=()), node)
    assert from_node.family(4).primary_ip == "172.16.0.9" and from_node.family(6).primary_ip == ""


def test_unset_node_port_addresses_mean_every_address_or_the_primary_ones() -> None:
    every = resolve_context(config(), None)
    assert every.family(4).node_port_ips is None and every.family(4).node_port_loopback
    assert every.health_check_ips == ()
    primary = resolve_context(config(), None, node_port_default="primary")
    assert primary.family(4).node_port_ips == ("10.1.1.1",)
    assert primary.family(6).node_port_ips == ("fd00::5",)
    assert not primary.family(4).node_port_loopback
    assert primary.health_check_ips == ("10.1.1.1", "fd00::5")
    assert resolve_context(config(node_port_addresses=("primary",)), None) == primary


@pytest.mark.parametrize(("cidrs", "v4", "v6"), [
    (("10.0.0.0/8",), ("10.1.1.1", "10.9.9.9"), None),      # no IPv6 CIDR: every IPv6 one
    (("10.0.0.0/8", "fd00::/64"), ("10.1.1.1", "10.9.9.9"), ("fd00::5", "fd00::6")),
    (("0.0.0.0/0", "fd00::6/128"), None, ("fd00::6",)),        # a zero CIDR: every address
    (("127.0.0.0/8", "192.168.0.0/16"), ("192.168.1.5", "127.0.0.1"), None),
    (("::1/128",), None, ("::1",)),
    (("203.0.113.0/24",), (), None),                           # nothing inside: none
])
def test_node_port_cidrs_select_the_nodes_addresses(
        cidrs: tuple[str, ...], v4: tuple[str, ...] | None, v6: tuple[str, ...] | None) -> None:
    ctx = resolve_context(config(node_port_addresses=cidrs), None,
                          local_addresses=("10.9.9.9", "127.0.0.1", "fd00::6"))
    assert ctx.family(4).node_port_ips == v4
    assert ctx.family(6).node_port_ips == v6


def test_loopback_node_ports_are_marked_and_can_be_left_out() -> None:
    ctx = resolve_context(config(node_port_addresses=("127.0.0.0/8", "10.0.0.0/8")), None)
    v4 = ctx.family(4)
    assert v4.node_port_ips == ("10.1.1.1", "127.0.0.1") and v4.node_port_loopback
    assert v4.node_port_ips_routable == ("10.1.1.1",)
    assert not ctx.family(6).node_port_ips_routable  # None: every address, as given


def test_every_node_port_address_named_for_a_backend_that_lists_them() -> None:
    """IPVS needs one virtual server per NodePort address: "every address" is named once,
    here, from the interfaces the agent read (loopback and link-local never; a pod's
    veth with only a link-local address does not change the context)."""
    local = ("10.1.1.1", "10.9.9.9", "127.0.0.1", "169.254.3.3", "fe80::1", "fd00::7", "::1")
    every = resolve_context(config(), None, local)
    assert every.family(4).local_ips == ("10.1.1.1", "10.9.9.9")
    assert every.family(4).node_port_ips_listed == ("10.1.1.1", "192.168.1.5", "10.9.9.9")
    assert every.family(6).node_port_ips_listed == ("fd00::5", "fd00::6", "fd00::7")
    assert resolve_context(config(), None, (*local, "fe80::2")) == every
    cidrs = resolve_context(config(node_port_addresses=("10.9.0.0/16", "::1/128")), None, local)
    assert cidrs.family(4).node_port_ips_listed == ("10.9.9.9",)
    assert cidrs.family(6).node_port_ips_listed == ()


def test_health_check_ports_listen_where_node_ports_do() -> None:
    ipv4_only = config(node_ips=("10.1.1.1",), node_port_addresses=("10.0.0.0/8",))
    assert resolve_context(ipv4_only, None).health_check_ips == ("10.1.1.1",)
    dual = config(node_port_addresses=("10.0.0.0/8",))  # IPv6 unrestricted
    assert resolve_context(dual, None).health_check_ips == ()


def test_local_traffic_detection_per_mode() -> None:
    node = NodeInfo("node-a", pod_cidrs=("10.244.1.0/24", "fd10:1::/64"))
    cluster = resolve_context(config(cluster_cidrs=("10.244.0.0/16", "fd10::/48")), node)
    assert cluster.family(4).local_traffic == LocalTraffic("ClusterCIDR", ("10.244.0.0/16",))
    assert cluster.family(6).local_traffic.cidrs == ("fd10::/48",)
    per_node = resolve_context(config(detect_local_mode="NodeCIDR"), node)
    assert per_node.family(6).local_traffic == LocalTraffic("NodeCIDR", ("fd10:1::/64",))
    prefix = resolve_context(config(detect_local_mode="InterfaceNamePrefix",
                                    pod_interface_name_prefix="veth"), node)
    assert prefix.family(4).local_traffic.by_interface_prefix
    bridge = resolve_context(config(detect_local_mode="BridgeInterface",
                                    pod_bridge_interface="cbr0"), node)
    assert bridge.family(6).local_traffic == LocalTraffic("BridgeInterface", interface="cbr0")
    assert not resolve_context(config(), node).family(4).local_traffic.detectable
    assert not resolve_context(config(detect_local_mode="NodeCIDR"), None).family(
        4).local_traffic.detectable


ADDRESSES = st.lists(st.sampled_from(
    ["10.1.1.1", "10.2.2.2", "192.168.1.5", "127.0.0.1", "fd00::5", "fd00::9", "::1"]),
    unique=True)
CIDRS = st.lists(st.sampled_from(
    ["10.0.0.0/8", "10.1.1.1/32", "127.0.0.0/8", "0.0.0.0/0", "fd00::/64", "::1/128", "::/0",
     "198.51.100.0/24"]), unique=True, max_size=3)


@given(ADDRESSES, ADDRESSES, CIDRS)
def test_node_port_ips_are_addresses_of_the_node_inside_the_cidrs(
        node_ips: list[str], local: list[str], cidrs: list[str]) -> None:
    node_ips = [ip for ip in node_ips if not ipaddress.ip_address(ip).is_loopback]
    ctx = resolve_context(config(node_ips=tuple(node_ips), node_port_addresses=tuple(cidrs)),
                          None, local_addresses=local)
    for fam in ctx.families:
        if fam.node_port_ips is None:
            continue
        networks = [ipaddress.ip_network(c) for c in cidrs]
        for ip in fam.node_port_ips:
            address = ipaddress.ip_address(ip)
            assert address.version == fam.family
            assert ip in node_ips or ip in local or address.is_loopback
            assert any(address in n for n in networks)
        assert not any(ipaddress.ip_address(ip).is_loopback
                       for ip in fam.node_port_ips_routable or ())


def test_interface_addresses_reads_this_namespace() -> None:
    every = interface_addresses()
    assert "127.0.0.1" in every
    without_lo = interface_addresses(exclude=("lo",))
    assert "127.0.0.1" not in without_lo and set(without_lo) < set(every)
    ctx = resolve_context(config(node_port_addresses=("127.0.0.0/8",)), None, every)
    assert ctx.family(4).node_port_ips == ("127.0.0.1",)


def test_the_mode_decides_the_iptables_and_the_sysctls_once() -> None:
    """One answer per mode for every backend: the iptables to invoke, NodePorts on
    127.0.0.1, and kube-proxy's sysctls (which the agent sets, no backend)."""
    from svcproxy.sdk import ProxyMode

    plain = resolve_context(config(), None)
    assert (plain.ip_families, plain.iptables, plain.sysctls) == ((4, 6), "", ())
    iptables = resolve_context(config(), None, mode=ProxyMode("iptables", True),
                               iptables="legacy")
    assert iptables.iptables == "legacy" and iptables.localhost_nodeports
    assert dict(iptables.sysctls) == {"net/ipv4/conf/all/route_localnet": "1"}
    chosen = resolve_context(config(), None, mode=ProxyMode("iptables", True, iptables="nft"),
                             iptables="legacy")
    assert chosen.iptables == "nft", "the flag's choice over the node's"
    assert resolve_context(config(), None, mode=ProxyMode("ipvs")).iptables == "nft"
    lan = config(node_port_addresses=("10.0.0.0/8",))
    off = resolve_context(lan, None, mode=ProxyMode("iptables", True))
    assert not off.localhost_nodeports and off.sysctls == (), "no 127.0.0.1 NodePorts"
    no_v4 = resolve_context(config(), None, mode=ProxyMode("iptables", True), ip_families=(6,))
    assert not no_v4.localhost_nodeports
    ipvs = resolve_context(config(), None, mode=ProxyMode("ipvs", strict_arp=True),
                           ip_families=(4,))
    assert ipvs.ip_families == (4,) and not ipvs.localhost_nodeports
    assert dict(ipvs.sysctls) == {
        "net/ipv4/vs/conntrack": "1", "net/ipv4/vs/expire_nodest_conn": "1",
        "net/ipv4/vs/expire_quiescent_template": "1", "net/ipv4/ip_forward": "1",
        "net/bridge/bridge-nf-call-iptables": "1", "net/ipv4/conf/all/arp_ignore": "1",
        "net/ipv4/conf/all/arp_announce": "2"}
    dual = resolve_context(config(), None, mode=ProxyMode("ipvs"))
    assert dict(dual.sysctls)["net/ipv6/conf/all/forwarding"] == "1"
    nft = resolve_context(config(), None, mode=ProxyMode("nftables"))
    assert (nft.iptables, nft.sysctls) == ("", ())


# What only the node context may resolve: a backend that holds one of these decides a
# node fact itself (IPv6 present, which iptables, a sysctl to write).
NODE_FACTS = ("if_inet6", "disable_ipv6", "KUBE-IPTABLES-HINT", "write_text(",
              "net/ipv4/vs", "net.ipv4.vs", "conf/all/", "conf.all.", "echo {value}")


def test_no_backend_resolves_the_node_itself() -> None:

    backends = REPO / "backends"
    files = sorted(backends.rglob("*.py"))
    assert len(files) > 20, "the backends were found"
    offences = [f"{path.relative_to(backends.parent)}:{n}: {fact}"
                for path in files
                for n, line in enumerate(path.read_text().splitlines(), 1)
                for fact in NODE_FACTS if fact in line]
    assert not offences, "backends resolve node facts:\n" + "\n".join(offences)
