"""Command-line plugin of the nft backend (``svcproxy backend nft``)."""

from __future__ import annotations

import argparse

from svcproxy.agent.config import NodeConfig
from svcproxy.sdk import Backend

from .backend import NftBackend
from .names import TABLE


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--nft-table", default=TABLE, metavar="NAME",
        help="name of the ip and ip6 tables this backend owns; nothing outside them is "
        "touched, --cleanup deletes them (default %(default)s)",
    )


def create(args: argparse.Namespace, config: NodeConfig) -> Backend:
    return NftBackend(config, table=args.nft_table)
