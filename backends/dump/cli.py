"""Command-line plugin of the dump backend."""

from __future__ import annotations

import argparse

from svcproxy.backends.dump.backend import DumpBackend
from svcproxy.sdk import Backend, NodeConfig

HELP = "print the node's state and each change as JSON lines (the reference backend)"


def add_arguments(parser: argparse._ArgumentGroup) -> None:
    """The dump backend has no flags of its own."""


def create(args: argparse.Namespace, config: NodeConfig) -> Backend:
    return DumpBackend()
