"""Command-line plugin of the ebpf backend (``svcproxy backend ebpf``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from svcproxy.sdk import Backend, BackendPlugin, NodeConfig, installed_backends

from .backend import EbpfBackend
from .compose import Composed
from .loader import OBJECT, Layout, LoadError
from .names import PIN_DIR
from .packet_cli import add_packet_arguments, capacity, packet_backend

HELP = "balance at connect()/sendmsg() with cgroup BPF programs (socket level)"


def unified_cgroup(mounts: str | None = None) -> Path:
    """Where the cgroup v2 hierarchy is mounted (/sys/fs/cgroup on most hosts,
    /sys/fs/cgroup/unified on hybrid ones); /sys/fs/cgroup when none is."""
    if mounts is None:
        try:
            mounts = Path("/proc/self/mounts").read_text()
        except OSError:
            mounts = ""
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) > 2 and fields[2] == "cgroup2":
            return Path(fields[1])
    return Path("/sys/fs/cgroup")


PACKET_PATHS = ("nft", "bpf", "none")


def _packet_backend(name: str) -> BackendPlugin | None:
    """The plugin serving packets next to the socket programs, found as any backend is."""
    found = installed_backends().get(name)
    return found.load() if found is not None else None


def add_arguments(parser: argparse._ArgumentGroup) -> None:
    parser.add_argument(
        "--ebpf-packet-path", choices=PACKET_PATHS, default="nft",
        help="backend run in the same agent for what no socket hook sees: connections from "
        "other nodes and outside (NodePort, externalIPs, load balancers), SCTP, processes "
        "outside --ebpf-cgroup. 'nft' makes one DaemonSet serve every path (its --nft-* "
        "flags apply); 'bpf' serves NodePorts from outside with tc programs on the node's "
        "devices and no nftables/iptables rule (rows served: docs/ebpf-packet-path.md); "
        "'none' programs the socket hooks only (default %(default)s)")
    parser.add_argument(
        "--ebpf-cgroup", type=Path, default=None, metavar="DIR",
        help="cgroup v2 directory whose processes (and their children's) get socket-level "
        "load balancing; on a node, the root of the hierarchy (default: where cgroup2 is "
        "mounted, e.g. /sys/fs/cgroup)")
    parser.add_argument(
        "--ebpf-pin-dir", type=Path, default=PIN_DIR, metavar="DIR",
        help="directory on a bpf filesystem where the maps and links are pinned: a restarted "
        "backend adopts them, --cleanup removes them (default %(default)s)")
    parser.add_argument(
        "--ebpf-object", type=Path, default=OBJECT, metavar="FILE",
        help="the compiled programs (default: the packaged object)")
    parser.add_argument(
        "--ebpf-max-services", type=capacity, default=65536, metavar="N",
        help="capacity of the services map: addresses x ports x protocols (default "
        "%(default)s; changing it on a node needs --cleanup first)")
    parser.add_argument(
        "--ebpf-max-endpoints", type=capacity, default=262144, metavar="N",
        help="capacity of the endpoints map; a changing service briefly holds its old and "
        "new endpoints (default %(default)s)")
    parser.add_argument(
        "--dump", action="store_true",
        help="print the pinned maps as services and their endpoints, then exit")
    add_packet_arguments(parser)
    nft = _packet_backend("nft")
    if nft is not None:
        nft.add_arguments(parser)


def create(args: argparse.Namespace, config: NodeConfig) -> Backend:
    layout = Layout(pin_dir=args.ebpf_pin_dir, cgroup=args.ebpf_cgroup or unified_cgroup(),
                    object_path=args.ebpf_object, max_services=args.ebpf_max_services,
                    max_endpoints=args.ebpf_max_endpoints)
    if args.dump:
        from .dump import dump_lines
        from .packet_dump import packet_dump_lines

        try:
            for line in dump_lines(layout.pin_dir):
                print(line)
            for line in packet_dump_lines(layout.pin_dir):
                print(line)
        except LoadError as err:
            print(f"svcproxy: error: {err}", file=sys.stderr)
            raise SystemExit(1) from None
        raise SystemExit(0)
    backend = EbpfBackend(config, layout)
    if not args.cleanup:
        try:
            backend.start()
        except LoadError as err:
            print(f"svcproxy: error: {err}", file=sys.stderr)
            raise SystemExit(1) from None
    others: list[Backend] = []
    if args.ebpf_packet_path == "bpf" or args.cleanup:
        # --cleanup removes the tc programs whichever path this run names.
        others.append(packet_backend(args, config))
    if args.ebpf_packet_path in ("bpf", "none"):
        return Composed(backend, *others) if others else backend
    plugin = _packet_backend(args.ebpf_packet_path)
    if plugin is None:
        print(f"svcproxy: error: --ebpf-packet-path {args.ebpf_packet_path}: no such backend "
              "is installed; use --ebpf-packet-path none", file=sys.stderr)
        raise SystemExit(2)
    return Composed(backend, *others, plugin.create(args, config))
