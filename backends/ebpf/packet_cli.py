"""The flags of ``--ebpf-packet-path bpf`` and the packet backend they make."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from svcproxy.sdk import NodeConfig, parse_duration

from . import maglev, pod_devices, xdp
from .ct_gc import CtTimeouts, gc_interval
from .loader import LoadError
from .packet_backend import PacketBackend
from .packet_loader import OBJECT, PacketLayout
from .packet_render import LB_ALGORITHMS, LB_ANNOTATION

log = logging.getLogger(__name__)

MAX_CAPACITY = 1 << 31  # the most entries the kernel gives a BPF hash map (E2BIG beyond)
MAX_LIFETIME = (1 << 32) - 1  # struct ct_timeouts (bpf/ct.h) holds u32 seconds
CT_FLAGS = (("--conntrack-tcp-timeout-established", "conntrack_tcp_timeout_established"),
            ("--conntrack-tcp-timeout-close-wait", "conntrack_tcp_timeout_close_wait"),
            ("--conntrack-udp-timeout", "conntrack_udp_timeout"),
            ("--conntrack-udp-timeout-stream", "conntrack_udp_timeout_stream"))


def _devices(text: str) -> tuple[str, ...]:
    """``eth0,bond0`` as its device names; a name the kernel never gives a device
    (its dev_valid_name) is refused with what is valid."""
    found = tuple(d for d in (part.strip() for part in text.split(",")) if d)
    for name in found:
        if (len(name.encode()) >= pod_devices.IFNAMSIZ or name in (".", "..")
                or any(c in "/:" or c.isspace() for c in name)):
            raise argparse.ArgumentTypeError(
                f"{name!r} is no device name; expected names of 1 to 15 characters without "
                "'/', ':' or whitespace, comma-separated (e.g. eth0,bond0)")
    return found


def _table_size(text: str) -> int:
    try:
        size = int(text)
    except ValueError:
        size = 0
    if not 251 <= size <= 65521 or not maglev.is_prime(size):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a prime between 251 and 65521 (e.g. "
            f"{', '.join(map(str, maglev.SIZES))})")
    return size


def _duration(text: str) -> float:
    """A Go duration (24h0m0s, 90s, 0), as kube-proxy's --conntrack-* flags take."""
    try:
        value = parse_duration(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from err
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is negative")
    return value


def capacity(text: str) -> int:
    """A map size flag's argparse type: a count of entries the kernel can give a map."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= MAX_CAPACITY:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a count of entries from 1 to {MAX_CAPACITY} (the most a BPF "
            "hash map holds)")
    return value


def add_packet_arguments(parser: argparse._ArgumentGroup) -> None:
    parser.add_argument(
        "--ebpf-devices", type=_devices, default=(), metavar="DEV[,DEV...]",
        help="with --ebpf-packet-path bpf: the devices whose traffic the tc programs serve "
        "(default: those holding the node IPs)")
    parser.add_argument(
        "--ebpf-pod-devices", type=pod_devices.patterns, default=(), metavar="PATTERN[,...]",
        help="with --ebpf-packet-path bpf: also attach the tc programs to every device whose "
        "name matches (shell-style, e.g. 'cali*' or 'lxc*': each pod's host-side veth, as "
        "Calico's eBPF dataplane does), so what the socket programs cannot take - "
        "processes outside --ebpf-cgroup, SCTP - is served as it enters the node; a device "
        "that appears later is attached when the kernel announces it, and forgotten when "
        "it goes (default: none)")
    parser.add_argument(
        "--ebpf-lb-algorithm", choices=LB_ALGORITHMS, default="random",
        help="with --ebpf-packet-path bpf: how a new flow from outside picks its endpoint: "
        "'random', or 'maglev' (consistent hashing: removing one of N endpoints moves about "
        f"1/N of the flows, and every node picks the same endpoint for a flow). A service's "
        f"annotation {LB_ANNOTATION} overrides it (default %(default)s)")
    parser.add_argument(
        "--ebpf-maglev-table-size", type=_table_size, default=maglev.DEFAULT_SIZE,
        metavar="PRIME",
        help="slots of each service port's Maglev table, a prime at least 100 x its "
        "endpoints; each table takes 2 bytes a slot (default %(default)s; changing it on a "
        "node needs --cleanup first)")
    parser.add_argument(
        "--ebpf-max-flows", type=capacity, default=262144, metavar="N",
        help="capacity of the connection tracking map (LRU: the least recently used flow "
        "goes first); each flow to another node takes two entries (default %(default)s)")
    parser.add_argument(
        "--ebpf-dsr", action="store_true",
        help="with --ebpf-packet-path bpf: direct server return, as Cilium's: a NodePort, "
        "externalIP or load-balancer flow (externalTrafficPolicy Cluster) to an endpoint on "
        "another node is sent to that node in Geneve (UDP 6081) without SNAT; that node "
        "delivers it with the client's address and the reply goes straight to the client "
        "from the service's address. Every node needs it (it takes the Geneve header off), "
        "and the route to the endpoints must carry 80 more bytes than the clients send")
    parser.add_argument(
        "--ebpf-xdp", nargs="?", const="auto", default="off", choices=xdp.MODES,
        metavar="MODE",
        help="with --ebpf-packet-path bpf: also run the XDP program on --ebpf-devices, which "
        "forwards NodePort/externalIP/VIP flows to endpoints on other nodes (DNAT + SNAT) "
        "and their replies before the stack sees them, leaving the rest to tc. MODE: auto "
        "(the flag alone: native where the driver has XDP, else generic), native, generic "
        "(veth: its native XDP cannot send back out without a program on the peer), or off "
        "(default %(default)s). A device where it cannot attach is logged and served by tc")
    add_conntrack_arguments(parser)


def add_conntrack_arguments(parser: argparse._ArgumentGroup) -> None:
    """kube-proxy's --conntrack-* timeouts, applied to the tc connection tracking map
    (kube-proxy's config file sets them through conntrack.*), and the GC interval."""
    parser.add_argument(
        "--conntrack-tcp-timeout-established", type=_duration, default=86400.0,
        metavar="DURATION",
        help="with --ebpf-packet-path bpf: idle lifetime of a TCP flow once its endpoint "
        "answered (0: nf_conntrack's 5 days) (default 24h0m0s)")
    parser.add_argument(
        "--conntrack-tcp-timeout-close-wait", type=_duration, default=3600.0,
        metavar="DURATION",
        help="with --ebpf-packet-path bpf: idle lifetime of a TCP flow after one side's FIN "
        "(0: nf_conntrack's 60s) (default 1h0m0s). A TCP flow before any answer lives 60s, "
        "after both FINs or a RST 10s (Cilium's defaults)")
    parser.add_argument(
        "--conntrack-udp-timeout", type=_duration, default=0.0, metavar="DURATION",
        help="with --ebpf-packet-path bpf: idle lifetime of a UDP flow its endpoint never "
        "answered (0: nf_conntrack's 30s) (default 0)")
    parser.add_argument(
        "--conntrack-udp-timeout-stream", type=_duration, default=0.0, metavar="DURATION",
        help="with --ebpf-packet-path bpf: idle lifetime of a UDP flow that was answered "
        "(0: nf_conntrack's 120s) (default 0)")
    parser.add_argument(
        "--ebpf-ct-gc-interval", type=gc_interval, default=60.0, metavar="DURATION",
        help="with --ebpf-packet-path bpf: how often expired flows are removed from the "
        "connection tracking map (a flow idle past its lifetime is a new flow at its next "
        "packet whenever the pass runs): from 1s to 168h0m0s, or 0 for never (the LRU "
        "alone makes room) (default 1m0s)")


def ct_timeouts(args: argparse.Namespace) -> CtTimeouts:
    """The lifetimes of the --conntrack-* values (kube-proxy's config file sets the same
    attributes), each longer than the map holds clamped (``held``)."""
    return CtTimeouts.of(*(held(flag, getattr(args, dest)) for flag, dest in CT_FLAGS))


def held(flag: str, seconds: float) -> float:
    """``seconds``, or the longest lifetime the map holds (about 136 years) when it is
    longer, with a warning: a valid value we cannot hold degrades that value alone."""
    if seconds <= MAX_LIFETIME:
        return seconds
    log.warning("%s %gs is longer than the tc connection tracking map holds; using %ds "
                "(about 136 years) for it", flag, seconds, MAX_LIFETIME)
    return float(MAX_LIFETIME)


def packet_backend(args: argparse.Namespace, config: NodeConfig) -> PacketBackend:
    """The packet backend of these flags, started unless this is --cleanup."""
    layout = PacketLayout(pin_dir=Path(args.ebpf_pin_dir), devices=args.ebpf_devices,
                          object_path=OBJECT, maglev_size=args.ebpf_maglev_table_size,
                          max_services=args.ebpf_max_services,
                          max_endpoints=args.ebpf_max_endpoints,
                          max_flows=args.ebpf_max_flows, dsr=args.ebpf_dsr,
                          xdp=args.ebpf_xdp, pod_devices=args.ebpf_pod_devices,
                          ct_timeouts=ct_timeouts(args))
    backend = PacketBackend(config, layout, args.ebpf_lb_algorithm,
                            gc_interval=args.ebpf_ct_gc_interval)
    if not args.cleanup and (args.ebpf_devices or config.node_ips):
        try:
            backend.start()
        except (LoadError, RuntimeError) as err:
            print(f"svcproxy: error: {err}", file=sys.stderr)
            raise SystemExit(1) from None
    return backend
