"""How ``svcproxy backend NAME`` finds backends: entry points of group ``svcproxy.backends``.

A package registers a backend in its ``pyproject.toml``; the value names a module (or
any object) with ``add_arguments`` and ``create``, as the built-in backends do::

    [project.entry-points."svcproxy.backends"]
    mine = "mine.cli"

``svcproxy backend`` lists what is installed; ``svcproxy backend mine --api ...`` runs
it with every node-agent flag plus the flags its ``add_arguments`` adds.
"""

from __future__ import annotations

import argparse
import logging
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points
from typing import Protocol, runtime_checkable

from svcproxy.sdk.backend import Backend
from svcproxy.sdk.config import NodeConfig

__all__ = ["ENTRY_POINT_GROUP", "BackendPlugin", "InstalledBackend", "installed_backends"]

ENTRY_POINT_GROUP = "svcproxy.backends"

log = logging.getLogger(__name__)


@runtime_checkable
class BackendPlugin(Protocol):
    """What an entry point of group ``svcproxy.backends`` loads (usually a module).

    It may also define ``HELP``, one line for ``svcproxy backend``'s list (default:
    the first line of its docstring).
    """

    def add_arguments(self, parser: argparse._ArgumentGroup) -> None:
        """Add the backend's own flags (name them ``--NAME-...``)."""

    def create(self, args: argparse.Namespace, config: NodeConfig) -> Backend:
        """The backend, from the parsed flags and the node's configuration."""


@dataclass(frozen=True, slots=True)
class InstalledBackend:
    """One registered backend; ``load`` imports it."""

    name: str
    entry_point: EntryPoint

    @property
    def distribution(self) -> str:
        """The installed package that registers it, with its version."""
        dist = self.entry_point.dist
        return f"{dist.name} {dist.version}" if dist is not None else "?"

    def load(self) -> BackendPlugin:
        """Import the plugin; raises TypeError when it lacks add_arguments or create."""
        plugin = self.entry_point.load()
        if not isinstance(plugin, BackendPlugin):
            raise TypeError(f"{self.entry_point.value} (backend {self.name}) has no "
                            "add_arguments(parser) and create(args, config)")
        return plugin


def installed_backends() -> dict[str, InstalledBackend]:
    """Every registered backend by name, sorted; a name registered twice keeps the first
    (with a warning naming both)."""
    found: dict[str, InstalledBackend] = {}
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name in found:
            if found[ep.name].entry_point.value != ep.value:
                log.warning("backend %s is registered twice (%s and %s); using the first",
                            ep.name, found[ep.name].entry_point.value, ep.value)
            continue
        found[ep.name] = InstalledBackend(ep.name, ep)
    return dict(sorted(found.items()))


def plugin_help(plugin: object) -> str:
    """One line describing a plugin: its ``HELP``, else its docstring's first line."""
    text = getattr(plugin, "HELP", None) or (getattr(plugin, "__doc__", None) or "").strip()
    return text.splitlines()[0] if text else ""
