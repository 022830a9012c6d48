"""An in-memory StateSource for tests: push states, the runner takes them."""

from __future__ import annotations

import threading
from collections.abc import Iterable

from svcproxy.model import ServicePortKey
from svcproxy.sdk.backend import Changes, NodeState


class FakeSource:
    """Behaves like NodeStateClient: changes accumulate until ``take``."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._state: NodeState | None = None
        self._keys: set[ServicePortKey] = set()
        self._triggers: list[float] = []
        self._node_changed = False
        self._full = True
        self._endpoint_changes = 0
        self.takes = 0

    def push(
        self,
        state: NodeState,
        changed: Iterable[ServicePortKey] = (),
        *,
        node_changed: bool = False,
        trigger_times: Iterable[float] = (),
        reset: bool = False,
    ) -> None:
        """A new consistent state; ``reset`` marks a stream reset (next take is full)."""
        with self._cond:
            changed = set(changed)
            self._state = state
            self._keys |= changed
            self._node_changed |= node_changed
            self._triggers.extend(trigger_times)
            self._full |= reset
            self._endpoint_changes += len(changed)
            self._cond.notify_all()

    def _has_changes(self) -> bool:
        return self._state is not None and (self._full or bool(self._keys) or self._node_changed)

    def wait(self, timeout: float | None) -> bool:
        with self._cond:
            return self._cond.wait_for(self._has_changes, timeout)

    def take(self) -> tuple[NodeState, Changes] | None:
        with self._cond:
            if self._state is None:
                return None
            self.takes += 1
            full = self._full
            changes = Changes(
                services=frozenset(self._state.services) if full else frozenset(self._keys),
                node_changed=self._node_changed or full,
                full=full,
                reason="initial" if full else "changes",
                trigger_times=tuple(self._triggers),
            )
            self._keys.clear()
            self._triggers.clear()
            self._node_changed = self._full = False
            self._endpoint_changes = 0
            return self._state, changes

    def pending(self) -> tuple[int, int]:
        with self._cond:
            return len(self._keys), self._endpoint_changes
