"""The proxy's health as kube-proxy defines it (pkg/proxy/healthcheck ProxyHealthServer).

Healthy unless an update has been queued and not applied within the health
timeout (2 x --sync-period). /healthz additionally requires the node to be
eligible: not being deleted (``NodeInfo.terminating``, which the frontend sets
for a deletionTimestamp or the ToBeDeletedByClusterAutoscaler taint).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class HealthStatus:
    healthy: bool
    # Unix time of the last successful sync (0: never); kube-proxy reports the
    # current time instead while healthy.
    last_updated: float
    current_time: float
    node_eligible: bool


class ProxyHealth:
    """Thread-safe record of queued and applied updates, and of node eligibility."""

    def __init__(self, timeout: float, clock: Callable[[], float] = time.time) -> None:
        self._timeout = timeout
        self._clock = clock
        self._lock = threading.Lock()
        self._last_updated = 0.0
        self._oldest_queued: float | None = None
        self._node_eligible = True

    @property
    def timeout(self) -> float:
        return self._timeout

    def queued(self) -> None:
        """An update is waiting to be applied (keeps the oldest such moment)."""
        with self._lock:
            if self._oldest_queued is None:
                self._oldest_queued = self._clock()

    def updated(self) -> None:
        """Everything queued so far has been applied."""
        with self._lock:
            self._oldest_queued = None
            self._last_updated = self._clock()

    def set_node_eligible(self, eligible: bool) -> None:
        with self._lock:
            self._node_eligible = eligible

    def status(self) -> HealthStatus:
        """Liveness of the sync loop, with node eligibility reported separately."""
        with self._lock:
            now = self._clock()
            late = self._oldest_queued is not None and now - self._oldest_queued >= self._timeout
            return HealthStatus(
                healthy=not late,
                last_updated=self._last_updated,
                current_time=now,
                node_eligible=self._node_eligible,
            )

    def is_healthy(self) -> bool:
        """The proxier's own health, ignoring the node (as health-check node ports use it)."""
        return self.status().healthy
