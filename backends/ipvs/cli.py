"""``svcproxy backend ipvs``: kube-proxy's --ipvs-* flags and the start-up check.

When the kernel has no IPVS, the backend says so and falls back to the
iptables backend, as kube-proxy does.
"""

from __future__ import annotations

import argparse
import logging

from svcproxy.backends.ipvs.options import SCHEDULERS, IpvsOptions, OptionError
from svcproxy.sdk import Backend, NodeConfig

HELP = "program IPVS virtual servers, ipsets and a fixed set of iptables rules"

log = logging.getLogger(__name__)


def _seconds(text: str) -> int:
    """argparse type: a Go duration (900s, 15m, 0) as whole seconds."""
    from svcproxy.sdk import parse_duration

    try:
        value = parse_duration(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from err
    if value < 0:
        raise argparse.ArgumentTypeError("must not be negative")
    return int(value)


def _cidrs(text: str) -> tuple[str, ...]:
    from svcproxy.sdk import cidr_list

    return cidr_list(text)


def add_arguments(parser: argparse._ArgumentGroup) -> None:
    """The IPVS backend's flags (kube-proxy's names)."""
    parser.add_argument(
        "--ipvs-scheduler", default="rr", metavar="NAME",
        help=f"IPVS scheduler for every virtual server: {', '.join(SCHEDULERS)} (default rr). "
        "A service may choose its own with the annotation svcproxy.io/ipvs-scheduler")
    parser.add_argument(
        "--ipvs-exclude-cidrs", type=_cidrs, default=(), metavar="CIDRS",
        help="comma-separated CIDRs: IPVS virtual servers with an address in them are never "
        "touched (kept through syncs and --cleanup)")
    parser.add_argument(
        "--ipvs-strict-arp", action="store_true",
        help="set arp_ignore=1 and arp_announce=2 so that the node does not answer ARP for "
        "service addresses bound to kube-ipvs0")
    parser.add_argument("--ipvs-tcp-timeout", type=_seconds, default=0, metavar="DURATION",
                        help="idle timeout of established IPVS TCP connections (0: unchanged)")
    parser.add_argument("--ipvs-tcpfin-timeout", type=_seconds, default=0, metavar="DURATION",
                        help="timeout of IPVS TCP connections after a FIN (0: unchanged)")
    parser.add_argument("--ipvs-udp-timeout", type=_seconds, default=0, metavar="DURATION",
                        help="timeout of IPVS UDP flows (0: unchanged)")
    parser.add_argument(
        "--ipvs-graceful-termination-timeout", type=_seconds, default=600, metavar="DURATION",
        help="a removed endpoint's real server gets weight 0 and is deleted once its "
        "connections are gone, or at the latest after this (default 10m)")
    parser.add_argument(
        "--ipvs-no-fallback", action="store_true",
        help="exit with the reason when the kernel has no IPVS, as kube-proxy does, instead "
        "of running the iptables backend (the fallback is logged, exported as "
        "svcproxy_ipvs_fallback{reason} and shown in /healthz as ipvsFallback)")


def options_from_args(args: argparse.Namespace) -> IpvsOptions:
    """IpvsOptions from the flags; exits with status 2 and a clear message when invalid."""
    try:
        return IpvsOptions(
            scheduler=args.ipvs_scheduler,
            exclude_cidrs=tuple(args.ipvs_exclude_cidrs),
            strict_arp=args.ipvs_strict_arp,
            tcp_timeout=args.ipvs_tcp_timeout,
            tcpfin_timeout=args.ipvs_tcpfin_timeout,
            udp_timeout=args.ipvs_udp_timeout,
            graceful_termination_timeout=float(args.ipvs_graceful_termination_timeout),
        )
    except OptionError as err:
        raise SystemExit(f"svcproxy: error: {err}") from err


def ipvs_available() -> str:
    """"" when this kernel has IPVS, else why not."""
    from svcproxy.backends.ipvs.netlink import IpvsUnavailable, resolve_family

    try:
        resolve_family()
    except IpvsUnavailable as err:
        return str(err)
    return ""


def _iptables_fallback(args: argparse.Namespace, config: NodeConfig) -> Backend:
    from svcproxy.sdk import installed_backends

    iptables_cli = installed_backends()["iptables"].load()  # as any installed backend
    defaults = argparse.ArgumentParser(add_help=False)
    iptables_cli.add_arguments(defaults.add_argument_group("iptables"))
    merged = argparse.Namespace(**{**vars(defaults.parse_args([])), **vars(args)})
    return iptables_cli.create(merged, config)


def create(args: argparse.Namespace, config: NodeConfig) -> Backend:
    """The IPVS backend, or the iptables backend when the kernel has no IPVS."""
    from svcproxy.backends.ipvs.backend import IpvsBackend

    options = options_from_args(args)
    why = ipvs_available()
    if why and getattr(args, "ipvs_no_fallback", False):
        raise SystemExit(f"svcproxy: error: ipvs: this kernel has no IPVS ({why}); load the "
                         "ip_vs module, or drop --ipvs-no-fallback to run the iptables backend")
    if why:
        from svcproxy.backends.ipvs.fallback import IptablesFallback

        log.warning("ipvs: this kernel has no IPVS (%s); load the ip_vs module or run the "
                    "iptables backend. Falling back to the iptables backend.", why)
        return IptablesFallback(_iptables_fallback(args, config), why)
    return IpvsBackend(config, options)
