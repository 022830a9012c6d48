"""Thin adapter over the iptables programs of one family and one mode (nft or legacy).

Writes go through ``iptables-restore --noflush`` (one transaction per call);
reads through ``iptables-save``. ``prefix`` runs every command through a
wrapper such as ``ip netns exec NS`` (tests and benchmarks).
"""

from __future__ import annotations

import logging
import re
import subprocess
import tempfile
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TypeVar

from svcproxy.backends.iptables.nftrules import NftRules
from svcproxy.backends.iptables.render_restore import SavedTable, parse_save

log = logging.getLogger(__name__)
T = TypeVar("T")

MODES = ("nft", "legacy")
WAIT_SECONDS = "5"


class IptablesError(RuntimeError):
    """An iptables program failed; the message carries its stderr and the failing lines."""


def _program(family: int, mode: str, suffix: str = "") -> str:
    base = "iptables" if family == 4 else "ip6tables"
    return f"{base}-{mode}{suffix}"


class Iptables:
    """The iptables programs of one family in one mode."""

    def __init__(self, family: int, mode: str, prefix: Sequence[str] = ()) -> None:
        self.family = family
        self.mode = mode
        self.prefix = tuple(prefix)

    def _run(self, args: list[str], stdin: str | None = None,
             check: bool = True) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run([*self.prefix, *args], input=stdin, capture_output=True,
                              text=True, check=False)
        if check and proc.returncode != 0:
            raise IptablesError(f"{args[0]} exited {proc.returncode}: {proc.stderr.strip()}")
        return proc

    def restore(self, text: str) -> None:
        """Apply one iptables-restore --noflush transaction (its output, such as what a
        ``-S`` line lists, is discarded)."""
        args = [*self.prefix, _program(self.family, self.mode, "-restore"), "--noflush",
                "--wait", WAIT_SECONDS]
        proc = subprocess.run(args, input=text, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True, check=False)
        if proc.returncode != 0:
            raise IptablesError(
                f"{_program(self.family, self.mode, '-restore')} failed: "
                f"{proc.stderr.strip()}{failing_lines(text, proc.stderr)}")

    def save(self, table: str | None = None) -> str:
        """iptables-save output, of one table or all."""
        args = [_program(self.family, self.mode, "-save")]
        if table:
            args += ["-t", table]
        return self._run(args).stdout

    def save_tables(self) -> dict[str, SavedTable]:
        """iptables-save of every table, parsed as it streams (at 10,000 services the
        output is 32 MB: read whole, it would be ~100 MB at the peak of a full resync)."""
        return self.save_stream(parse_save)

    def save_stream(self, consume: Callable[[Iterable[str]], T], *tables: str) -> T:
        """``consume`` the lines of iptables-save (of ``tables``, or all) as they stream."""
        args = [*self.prefix, _program(self.family, self.mode, "-save")]
        for table in tables:
            args += ["-t", table]
        with tempfile.TemporaryFile() as err, subprocess.Popen(
                args, stdout=subprocess.PIPE, stderr=err, text=True) as proc:
            assert proc.stdout is not None
            result = consume(proc.stdout)
            proc.wait()
            if proc.returncode != 0:
                err.seek(0)
                raise IptablesError(f"{args[len(self.prefix)]} exited {proc.returncode}: "
                                    f"{err.read().decode(errors='replace').strip()}")
        return result

    def rules(self) -> NftRules | None:
        """A netlink reader of the tables of iptables-nft (None in legacy mode: its
        tables are not nftables', read them with iptables-save)."""
        return NftRules(self.prefix) if self.mode == "nft" else None

    def chain_exists(self, table: str, chain: str) -> bool:
        proc = self._run([_program(self.family, self.mode), "--wait", WAIT_SECONDS,
                          "-t", table, "-S", chain], check=False)
        return proc.returncode == 0


def failing_lines(text: str, stderr: str, context: int = 2) -> str:
    """The input lines around the one iptables-restore names in its error, for the log."""
    match = re.search(r"line:? (\d+)", stderr)
    if not match:
        return ""
    lines = text.splitlines()
    n = int(match.group(1))
    start, end = max(0, n - 1 - context), min(len(lines), n + context)
    shown = "\n".join(f"  {i + 1}: {lines[i]}" for i in range(start, end))
    return f"\n{shown}"


class Sysctl:
    """Read /proc/sys in the namespace the commands run in (the node agent sets it)."""

    def __init__(self, prefix: Sequence[str] = ()) -> None:
        self.prefix = tuple(prefix)

    def get(self, name: str) -> str | None:
        if not self.prefix:
            path = Path("/proc/sys") / name
            return path.read_text().strip() if path.exists() else None
        proc = subprocess.run([*self.prefix, "cat", f"/proc/sys/{name}"], capture_output=True,
                              text=True, check=False)
        return proc.stdout.strip() if proc.returncode == 0 else None
