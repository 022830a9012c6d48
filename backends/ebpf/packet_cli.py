"""The flags of ``--ebpf-packet-path bpf`` and the packet backend they make."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from svcproxy.sdk import NodeConfig

from . import maglev
from .loader import LoadError
from .packet_backend import PacketBackend
from .packet_loader import OBJECT, PacketLayout
from .packet_plan import LB_ALGORITHMS, LB_ANNOTATION


def _devices(text: str) -> tuple[str, ...]:
    return tuple(d for d in (part.strip() for part in text.split(",")) if d)


def _table_size(text: str) -> int:
    size = int(text)
    if not 251 <= size <= 65521 or not maglev.is_prime(size):
        raise argparse.ArgumentTypeError(
            f"{size} is not a prime between 251 and 65521 (e.g. "
            f"{', '.join(map(str, maglev.SIZES))})")
    return size


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be 1 or more")
    return value


def add_packet_arguments(parser: argparse._ArgumentGroup) -> None:
    parser.add_argument(
        "--ebpf-devices", type=_devices, default=(), metavar="DEV[,DEV...]",
        help="with --ebpf-packet-path bpf: the devices whose traffic the tc programs serve "
        "(default: those holding the node IPs)")
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
        "--ebpf-max-flows", type=_positive, default=262144, metavar="N",
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


def packet_backend(args: argparse.Namespace, config: NodeConfig) -> PacketBackend:
    """The packet backend of these flags, started unless this is --cleanup."""
    layout = PacketLayout(pin_dir=Path(args.ebpf_pin_dir), devices=args.ebpf_devices,
                          object_path=OBJECT, maglev_size=args.ebpf_maglev_table_size,
                          max_services=args.ebpf_max_services,
                          max_endpoints=args.ebpf_max_endpoints,
                          max_flows=args.ebpf_max_flows, dsr=args.ebpf_dsr)
    backend = PacketBackend(config, layout, args.ebpf_lb_algorithm)
    if not args.cleanup and (args.ebpf_devices or config.node_ips):
        try:
            backend.start()
        except (LoadError, RuntimeError) as err:
            print(f"svcproxy: error: {err}", file=sys.stderr)
            raise SystemExit(1) from None
    return backend
