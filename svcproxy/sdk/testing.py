"""Test a backend without a cluster and without the frontend.

``FakeSource`` feeds the node agent's real sync runner by hand: push ``NodeState``
values and the keys that changed. ``RunningBackend`` runs a backend under that runner,
following any state server with ``client(node)`` and ``revision(node)``;
``objects_of`` reads Kubernetes objects from YAML or dicts.

A real frontend in-process, fed Kubernetes objects, is ``svcproxy.testing.FakeCluster``:
it needs the frontend installed too, so it lives outside the SDK.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

import yaml

from svcproxy.model import ServicePortKey
from svcproxy.sdk.backend import Backend, Changes, NodeState
from svcproxy.sdk.client import NodeStateClient

__all__ = ["FakeSource", "RunningBackend", "StateServer", "objects_of"]

KINDS = ("Service", "EndpointSlice", "Node")
Objects = str | Mapping[str, Any] | Iterable[Mapping[str, Any]]


class FakeSource:
    """A state source for the node agent's sync runner, fed by hand: ``push`` a
    ``NodeState`` and the keys that changed; they accumulate until the runner takes
    them, as with ``NodeStateClient``."""

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


def objects_of(*docs: Objects) -> list[dict[str, Any]]:
    """Kubernetes objects from YAML text (several documents, ``List`` kinds) or dicts.

    Raises ValueError for anything that is not a Service, EndpointSlice or Node.
    """
    out: list[dict[str, Any]] = []
    for doc in docs:
        if isinstance(doc, str):
            out += objects_of(*[d for d in yaml.safe_load_all(doc) if d is not None])
        elif isinstance(doc, Mapping):
            if str(doc.get("kind", "")).endswith("List"):
                out += objects_of(*doc.get("items") or [])
            elif doc.get("kind") in KINDS:
                out.append(dict(doc))
            else:
                raise ValueError(f"kind {doc.get('kind')!r} is not one of {', '.join(KINDS)}")
        else:
            out += objects_of(*doc)
    return out


class StateServer(Protocol):
    """What ``RunningBackend`` follows (``svcproxy.testing.FakeCluster`` is one)."""

    def client(self, node_name: str, *, start: bool = True) -> NodeStateClient:
        """A started client of ``node_name``'s state, stopped with the server."""

    def revision(self, node_name: str) -> int:
        """The revision a client of ``node_name`` has once it has every change so far."""


class RunningBackend:
    """A backend synced by the real runner from a state server (``FakeCluster.run``)."""

    def __init__(self, cluster: StateServer, backend: Backend, node_name: str,
                 min_sync_period: float, sync_period: float) -> None:
        from svcproxy.sdk.health import ProxyHealth
        from svcproxy.sdk.runner import SyncRunner

        self.cluster = cluster
        self.backend = backend
        self.node_name = node_name
        self.client = cluster.client(node_name)
        self.runner = SyncRunner(self.client, backend, health=ProxyHealth(2 * sync_period),
                                 sync_period=sync_period, min_sync_period=min_sync_period,
                                 retry_initial=0.05, poll=0.02)
        self._thread = threading.Thread(target=self.runner.run, name=f"sync-{node_name}",
                                        daemon=True)
        self._thread.start()

    @property
    def applied(self) -> NodeState | None:
        """The state the backend last applied successfully."""
        return self.runner.applied

    def wait_synced(self, timeout: float = 10.0) -> NodeState:
        """Wait until the backend has applied every change made so far; the state."""
        target = self.cluster.revision(self.node_name)

        def done() -> bool:
            applied = self.runner.applied
            return applied is not None and applied.revision >= target

        _wait(done, timeout, lambda: f"backend {self.backend.name} on {self.node_name} "
              f"applied revision {self.applied.revision if self.applied else None}, not "
              f"{target} (a failing sync is logged)")
        assert self.runner.applied is not None
        return self.runner.applied

    def stop(self) -> None:
        self.runner.stop()
        self._thread.join(10)
        self.client.stop()


def _wait(predicate: Any, timeout: float, describe: Any) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"after {timeout}s: {describe()}")
        time.sleep(0.01)
