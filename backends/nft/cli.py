"""Command-line plugin of the nft backend (``svcproxy backend nft``)."""

from __future__ import annotations

import argparse

from svcproxy.sdk import Backend, NodeConfig

from .apply import NftRunner, Runner
from .backend import NftBackend
from .names import TABLE

HELP = "program nftables (one table per address family owned by svcproxy)"


def add_arguments(parser: argparse._ArgumentGroup) -> None:
    parser.add_argument(
        "--nft-table", default=TABLE, metavar="NAME",
        help="name of the ip and ip6 tables this backend owns; nothing outside them is "
        "touched, --cleanup deletes them (default %(default)s)",
    )
    parser.add_argument(
        "--nft-api", choices=("lib", "exec"), default="lib",
        help="how transactions reach the kernel: 'lib' calls libnftables in-process (about "
        "3x faster per update at 10k services), 'exec' runs nft -f - per sync "
        "(default %(default)s)",
    )


def create(args: argparse.Namespace, config: NodeConfig) -> Backend:
    runner: Runner = NftRunner()
    if args.nft_api == "lib":
        from .libnft import LibNftRunner

        runner = LibNftRunner()
    return NftBackend(config, runner, table=args.nft_table)
