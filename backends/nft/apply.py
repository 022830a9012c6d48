"""Load nft text into the kernel with one ``nft -f -`` transaction."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


class Runner(Protocol):
    """Anything that applies nft text as one transaction (NftRunner, LibNftRunner)."""

    def apply(self, text: str) -> None: ...

    def check(self, text: str) -> None:
        """Send ``text`` to the kernel and abort it (``nft -c``): raise NftError if it
        would be refused, change nothing either way."""

    def list_sets(self, family: str) -> str:
        """``nft -j list sets FAMILY``: every set of the family, with its elements (JSON);
        raise NftError when it cannot be read."""


class NftError(RuntimeError):
    """``nft`` refused a transaction; nothing of it was applied."""


@dataclass(frozen=True, slots=True)
class NftRunner:
    """Runs ``nft``; ``prefix`` wraps it (e.g. ``ip netns exec NS``) for tests and tools."""

    prefix: Sequence[str] = ()
    nft: str = "nft"

    def apply(self, text: str) -> None:
        """Run ``text`` as one atomic transaction; raise NftError with nft's message."""
        if not text:
            return
        done = subprocess.run(
            [*self.prefix, self.nft, "-f", "-"], input=text.encode(), capture_output=True
        )
        if done.returncode != 0:
            raise NftError(summarize_error(done.stderr.decode(errors="replace"), text))

    def check(self, text: str) -> None:
        """``nft -c -f -``: the kernel validates the transaction and aborts it."""
        done = subprocess.run(
            [*self.prefix, self.nft, "-c", "-f", "-"], input=text.encode(), capture_output=True
        )
        if done.returncode != 0:
            raise NftError(summarize_error(done.stderr.decode(errors="replace"), text))

    def list_sets(self, family: str) -> str:
        """``nft -j list sets FAMILY`` (JSON, elements included)."""
        done = subprocess.run([*self.prefix, self.nft, "-j", "list", "sets", family],
                              capture_output=True)
        if done.returncode != 0:
            raise NftError(done.stderr.decode(errors="replace").strip() or "nft list sets")
        return done.stdout.decode()

    def list_table(self, family: str, table: str) -> str:
        """``nft list table`` output, or "" when the table does not exist."""
        done = subprocess.run(
            [*self.prefix, self.nft, "list", "table", family, table], capture_output=True
        )
        return done.stdout.decode() if done.returncode == 0 else ""


def summarize_error(stderr: str, text: str, limit: int = 12) -> str:
    """nft's error lines (capped), or the start of the text when nft said nothing."""
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    if not lines:
        lines = ["nft failed without a message; transaction began:", *text.splitlines()[:5]]
    more = f"\n... ({len(lines) - limit} more lines)" if len(lines) > limit else ""
    return "\n".join(lines[:limit]) + more
