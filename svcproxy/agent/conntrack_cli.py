"""Deleting conntrack entries with the conntrack(8) tool, and the agent's cleanup step."""

from __future__ import annotations

import logging
import re
import subprocess
from collections.abc import Sequence

from svcproxy.agent.conntrack import ConntrackFilter, stale_conntrack_filters
from svcproxy.sdk.backend import NodeState

log = logging.getLogger(__name__)

_DELETED = re.compile(r"(\d+) flow entries have been deleted")


class ConntrackError(RuntimeError):
    pass


def conntrack_args(f: ConntrackFilter) -> list[str]:
    """conntrack -D arguments selecting the entries of ``f``."""
    args = ["-D", "-f", "ipv6" if f.family == 6 else "ipv4", "-p", f.protocol.value.lower()]
    if f.orig_dst:
        args += ["--orig-dst", f.orig_dst]
    if f.orig_dport:
        args += ["--orig-port-dst", str(f.orig_dport)]
    if f.reply_src:
        args += ["--reply-src", f.reply_src]
    return args


class ConntrackCLI:
    """Runs ``conntrack``; ``command`` may carry a prefix such as ip netns exec NAME."""

    def __init__(self, command: Sequence[str] = ("conntrack",)) -> None:
        self._command = list(command)

    def delete(self, f: ConntrackFilter) -> int:
        """Delete the matching entries; returns how many were deleted."""
        proc = subprocess.run(
            [*self._command, *conntrack_args(f)], capture_output=True, text=True, timeout=30
        )
        match = _DELETED.search(proc.stderr + proc.stdout)
        if match is None:
            raise ConntrackError(
                f"conntrack {' '.join(conntrack_args(f))} failed (exit {proc.returncode}): "
                f"{proc.stderr.strip()}"
            )
        return int(match.group(1))


class ConntrackCleaner:
    """After a successful sync, deletes the UDP/SCTP entries the change made stale."""

    def __init__(self, tool: ConntrackCLI | None = None) -> None:
        self._tool = tool or ConntrackCLI()

    def after_sync(self, old: NodeState | None, new: NodeState) -> int:
        """Apply every deletion; failures are logged and do not stop the others."""
        deleted = 0
        for f in stale_conntrack_filters(old, new):
            try:
                n = self._tool.delete(f)
            except (ConntrackError, OSError, subprocess.TimeoutExpired) as err:
                log.error("Failed to delete stale conntrack entries %s: %s", f, err)
                continue
            if n:
                log.info("Deleted %d stale conntrack entries for %s", n, f)
            deleted += n
        return deleted
