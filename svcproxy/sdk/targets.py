"""Which frontend replica to watch, and when to move to another.

A node is given several frontend addresses (``--api`` repeated or comma-separated) or
one DNS name (``dns:///NAME:PORT``, resolved by gRPC to every address it has). The
client stays on a replica while its stream lives; when the stream breaks it tries the
next address at once, and only backs off once every address has failed in a row, so a
killed replica costs a node one reconnect, not a backoff.
"""

from __future__ import annotations

from collections.abc import Sequence


def split_targets(targets: str | Sequence[str]) -> list[str]:
    """Addresses from one string (comma-separated) or a list of them."""
    items = [targets] if isinstance(targets, str) else list(targets)
    out = [t.strip() for item in items for t in item.split(",") if t.strip()]
    if not out:
        raise ValueError("no frontend address given")
    return out


class Targets:
    """A ring of addresses: ``current``; ``failed()`` moves on and says whether to back off."""

    def __init__(self, targets: str | Sequence[str]) -> None:
        self.all = split_targets(targets)
        self._index = 0
        self._failures = 0

    @property
    def current(self) -> str:
        return self.all[self._index]

    def succeeded(self) -> None:
        """The current address served a stream."""
        self._failures = 0

    def failed(self) -> bool:
        """The current address failed: move to the next; True once all failed in a row."""
        self._failures += 1
        self._index = (self._index + 1) % len(self.all)
        return self._failures >= len(self.all)

    def __str__(self) -> str:
        return ",".join(self.all)
