"""What the sync runner needs from the SDK client (NodeStateClient satisfies it)."""

from __future__ import annotations

from typing import Protocol

from svcproxy.sdk.backend import Changes, NodeState


class StateSource(Protocol):
    def wait(self, timeout: float | None) -> bool:
        """Block until changes are pending (True) or ``timeout`` passes (False)."""

    def take(self) -> tuple[NodeState, Changes] | None:
        """The current state and what changed since the previous take (None: no snapshot yet)."""

    def pending(self) -> tuple[int, int]:
        """(service ports changed, endpoint changes) not yet taken."""
