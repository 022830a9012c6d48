"""Deleting conntrack entries with the conntrack(8) tool, and the agent's cleanup step.

The table is listed once per (family, protocol) and ``conntrack -D`` runs only
for filters that match an existing entry, so a sync touching many UDP services
costs one or two processes, not one per service IP.
"""

from __future__ import annotations

import ipaddress
import logging
import re
import subprocess
from collections.abc import Iterable, Sequence
from typing import Protocol as TypingProtocol

from svcproxy.model import Protocol, ServicePortKey
from svcproxy.sdk.backend import NodeState
from svcproxy.sdk.conntrack import (
    ConntrackEntry,
    ConntrackFilter,
    matches,
    stale_conntrack_filters,
)

log = logging.getLogger(__name__)

_DELETED = re.compile(r"(\d+) flow entries have been deleted")
_FIELD = re.compile(r"(src|dst|sport|dport)=(\S+)")


class ConntrackError(RuntimeError):
    pass


class ConntrackTool(TypingProtocol):
    def list(self, family: int, protocol: Protocol) -> list[ConntrackEntry]: ...

    def delete(self, f: ConntrackFilter) -> int: ...


def conntrack_args(f: ConntrackFilter) -> list[str]:
    """conntrack -D arguments selecting the entries of ``f``."""
    args = ["-D", *_selector(f.family, f.protocol)]
    if f.orig_dst:
        args += ["--orig-dst", f.orig_dst]
    if f.orig_dport:
        args += ["--orig-port-dst", str(f.orig_dport)]
    if f.reply_src:
        args += ["--reply-src", f.reply_src]
    return args


def _selector(family: int, protocol: Protocol) -> list[str]:
    return ["-f", "ipv6" if family == 6 else "ipv4", "-p", protocol.value.lower()]


def parse_entries(text: str, family: int, protocol: Protocol) -> list[ConntrackEntry]:
    """Entries from ``conntrack -L`` output (original tuple first, then the reply tuple)."""
    entries = []
    for line in text.splitlines():
        fields = _FIELD.findall(line)
        if len(fields) < 8:
            continue
        orig, reply = dict(fields[:4]), dict(fields[4:8])
        try:
            entries.append(ConntrackEntry(
                protocol, family, str(ipaddress.ip_address(orig["dst"])), int(orig["dport"]),
                str(ipaddress.ip_address(reply["src"])),
            ))
        except (KeyError, ValueError):
            continue
    return entries


class ConntrackCLI:
    """Runs ``conntrack``; ``command`` may carry a prefix such as ip netns exec NAME."""

    def __init__(self, command: Sequence[str] = ("conntrack",)) -> None:
        self._command = list(command)

    def _run(self, args: list[str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*self._command, *args], capture_output=True, text=True, timeout=60
        )

    def list(self, family: int, protocol: Protocol) -> list[ConntrackEntry]:
        """The table's entries of one family and protocol."""
        proc = self._run(["-L", *_selector(family, protocol)])
        if proc.returncode != 0:
            raise ConntrackError(f"conntrack -L failed (exit {proc.returncode}): "
                                 f"{proc.stderr.strip()}")
        return parse_entries(proc.stdout, family, protocol)

    def delete(self, f: ConntrackFilter) -> int:
        """Delete the matching entries; returns how many were deleted."""
        proc = self._run(conntrack_args(f))
        match = _DELETED.search(proc.stderr + proc.stdout)
        if match is None:
            raise ConntrackError(
                f"conntrack {' '.join(conntrack_args(f))} failed (exit {proc.returncode}): "
                f"{proc.stderr.strip()}"
            )
        return int(match.group(1))


_FAILURES = (ConntrackError, OSError, subprocess.TimeoutExpired)


class ConntrackCleaner:
    """After a successful sync, deletes the UDP/SCTP entries the change made stale."""

    def __init__(self, tool: ConntrackTool | None = None) -> None:
        self._tool: ConntrackTool = tool or ConntrackCLI()

    def after_sync(self, old: NodeState | None, new: NodeState,
                   changed: frozenset[ServicePortKey] | None = None) -> int:
        """Apply every needed deletion (``changed``: the service ports that may differ);
        failures are logged and do not stop the others."""
        filters = stale_conntrack_filters(old, new, changed)
        deleted = 0
        for group in {(f.family, f.protocol) for f in filters}:
            wanted = [f for f in filters if (f.family, f.protocol) == group]
            deleted += self._clean(group, wanted)
        return deleted

    def _clean(self, group: tuple[int, Protocol], filters: list[ConntrackFilter]) -> int:
        try:
            entries = self._tool.list(*group)
        except _FAILURES as err:
            log.error("Failed to list conntrack entries (%s); deleting blindly: %s", group, err)
            return self._delete(filters)
        return self._delete(f for f in filters if any(matches(f, e) for e in entries))

    def _delete(self, filters: Iterable[ConntrackFilter]) -> int:
        deleted = 0
        for f in filters:
            try:
                n = self._tool.delete(f)
            except _FAILURES as err:
                log.error("Failed to delete stale conntrack entries %s: %s", f, err)
                continue
            if n:
                log.info("Deleted %d stale conntrack entries for %s", n, f)
            deleted += n
        return deleted
