"""Command-line plugin of the iptables backend (``svcproxy backend iptables``)."""

from __future__ import annotations

import argparse

from svcproxy.sdk import Backend, NodeConfig

from .backend import IptablesBackend, IptablesOptions

HELP = "program iptables as kube-proxy's iptables mode does"


def boolean(text: str) -> bool:
    """argparse type: true/false as Go's flag package accepts them."""
    value = text.strip().lower()
    if value in ("1", "t", "true", "yes"):
        return True
    if value in ("0", "f", "false", "no"):
        return False
    raise argparse.ArgumentTypeError(f"not a boolean: {text!r}")


def masquerade_bit(text: str) -> int:
    """argparse type: a bit number of the fwmark, 0-31."""
    try:
        bit = int(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from err
    if not 0 <= bit <= 31:
        raise argparse.ArgumentTypeError("must be within [0, 31]")
    return bit


def add_arguments(parser: argparse._ArgumentGroup) -> None:
    parser.add_argument(
        "--iptables-localhost-nodeports", type=boolean, nargs="?", const=True, default=True,
        metavar="BOOL",
        help="accept NodePort connections on 127.0.0.1 (IPv4 only; sets route_localnet=1 in "
        "this network namespace). Needs --node-port-addresses to include 127.0.0.1, as the "
        "default does (default true)",
    )
    parser.add_argument(
        "--iptables-masquerade-bit", type=masquerade_bit, default=14, metavar="BIT",
        help="the bit of the packet mark that flags traffic for SNAT, 0-31 (default 14: 0x4000)",
    )
    parser.add_argument(
        "--iptables-mode", choices=("auto", "nft", "legacy"), default="auto",
        help="which iptables to drive: auto picks the one the node already uses, as "
        "kube-proxy's iptables-wrapper (kubelet hint chains, then the one with more rules; "
        "nft on an empty node) (default %(default)s)",
    )


def create(args: argparse.Namespace, config: NodeConfig) -> Backend:
    options = IptablesOptions(
        localhost_nodeports=args.iptables_localhost_nodeports,
        masquerade_bit=args.iptables_masquerade_bit,
        mode=args.iptables_mode,
    )
    return IptablesBackend(config, options)
