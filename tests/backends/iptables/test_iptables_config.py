"""The iptables backend's configuration: flags, NodePort addresses, local-traffic detection."""

from __future__ import annotations

import argparse

import pytest

from svcproxy.backends.iptables import cli
from svcproxy.backends.iptables.backend import IptablesBackend
from svcproxy.backends.iptables.familyconfig import (
    family_config,
    local_detection,
    masquerade_mark,
    nodeport_ips,
)
from svcproxy.model import NodeInfo
from svcproxy.sdk import ProxyMode, resolve_context
from svcproxy.sdk.config import NodeConfig

NODE = NodeConfig("n1", cluster_cidrs=("10.244.0.0/16", "fd00:244::/48"),
                  node_ips=("192.168.1.5", "10.0.0.5", "fd00:1::5"))


def localhost_nodeports_allowed(config: NodeConfig, wanted: bool) -> bool:
    """The node context's answer for --iptables-localhost-nodeports=``wanted``."""
    mode = ProxyMode("iptables", localhost_nodeports=wanted)
    return resolve_context(config, None, mode=mode).localhost_nodeports


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    return parser.parse_args(argv)


def test_flags_default_as_kube_proxy() -> None:
    args = parse()
    assert args.iptables_localhost_nodeports is True
    assert args.iptables_masquerade_bit == 14
    backend = cli.create(args, NODE)
    assert isinstance(backend, IptablesBackend) and backend.name == "iptables"


def test_flags_accept_go_style_booleans_and_reject_bad_bits() -> None:
    assert parse("--iptables-localhost-nodeports=false").iptables_localhost_nodeports is False
    assert parse("--iptables-localhost-nodeports").iptables_localhost_nodeports is True
    with pytest.raises(SystemExit):
        parse("--iptables-masquerade-bit", "32")
    with pytest.raises(SystemExit):
        parse("--iptables-mode", "ebpf")


def test_masquerade_bit_is_the_mark() -> None:
    assert masquerade_mark(14) == "0x4000"
    assert family_config(NODE, None, 4, masquerade_bit=3).masquerade_mark == "0x8"


def test_nodeports_default_to_every_local_address() -> None:
    assert nodeport_ips(NODE, 4) is None
    assert localhost_nodeports_allowed(NODE, True)
    assert not localhost_nodeports_allowed(NODE, False)


def test_nodeport_cidrs_select_node_ips_per_family() -> None:
    cfg = NodeConfig("n1", node_port_addresses=("192.168.0.0/16", "127.0.0.0/8"),
                     node_ips=NODE.node_ips)
    assert nodeport_ips(cfg, 4) == ("192.168.1.5", "127.0.0.1")
    assert nodeport_ips(cfg, 6) is None  # no IPv6 CIDR given: every address, as kube-proxy
    assert localhost_nodeports_allowed(cfg, True)
    lan_only = NodeConfig("n1", node_port_addresses=("192.168.0.0/16",), node_ips=NODE.node_ips)
    assert not localhost_nodeports_allowed(lan_only, True)
    assert nodeport_ips(NodeConfig("n1", node_port_addresses=("0.0.0.0/0",)), 4) is None


def test_primary_nodeport_addresses_are_the_first_ip_of_each_family() -> None:
    cfg = NodeConfig("n1", node_port_addresses=("primary",), node_ips=NODE.node_ips)
    assert nodeport_ips(cfg, 4) == ("192.168.1.5",)
    assert nodeport_ips(cfg, 6) == ("fd00:1::5",)
    assert not localhost_nodeports_allowed(cfg, True)


def test_local_traffic_detection_modes() -> None:
    assert local_detection(NODE, None, 6) == ("-s fd00:244::/48", "! -s fd00:244::/48")
    node = NodeInfo("n1", pod_cidrs=("10.244.3.0/24",))
    by_node = NodeConfig("n1", detect_local_mode="NodeCIDR")
    assert local_detection(by_node, node, 4) == ("-s 10.244.3.0/24", "! -s 10.244.3.0/24")
    assert local_detection(by_node, None, 4) == ("", "")
    prefix = NodeConfig("n1", detect_local_mode="InterfaceNamePrefix",
                        pod_interface_name_prefix="veth")
    assert local_detection(prefix, None, 4) == ("-i veth+", "! -i veth+")
    bridge = NodeConfig("n1", detect_local_mode="BridgeInterface", pod_bridge_interface="cbr0")
    assert local_detection(bridge, None, 6) == ("-i cbr0", "! -i cbr0")
    assert local_detection(NodeConfig("n1"), None, 4) == ("", "")


def test_localhost_nodeports_are_ipv4_only() -> None:
    assert family_config(NODE, None, 4, localhost_nodeports=True).localhost_nodeports
    assert not family_config(NODE, None, 6, localhost_nodeports=True).localhost_nodeports
