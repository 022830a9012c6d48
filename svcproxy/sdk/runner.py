"""The sync runner: when to call ``Backend.sync`` and with what (kube-proxy's sync loop).

* Changes are applied no more often than ``min_sync_period`` (between the
  starts of two syncs that apply changes); whatever arrives meanwhile is coalesced
  into one sync.
* A full sync runs at least every ``sync_period``. It never delays a change: changes
  that are due when it is go first, as their own partial sync, and it does not count
  against ``min_sync_period``. (For a ``StagedBackend`` the resync itself is a diff
  against what was applied: with nothing changed it writes nothing.)
* A periodic resync is where drift is repaired: a ``StagedBackend`` compares what the
  kernel holds with what it applied and writes again only what differs
  (``StagedBackend.find_drift``), so whatever someone else changed is back within one
  ``sync_period``.
* A service port the kernel refused is tried again when the backend says its retry is
  due (``retry_in()``, the refusals' backoff; never sooner than ``min_sync_period``
  after the last sync), as a partial sync of reason "refused", with no change needed.
* A failed sync is retried as a full sync after an exponential backoff
  (never sooner than ``min_sync_period``, at most ``sync_period``); the
  changes it carried are folded into the retry.
* Health: an update is "queued" when changes are noticed or a retry is
  scheduled, "applied" when a sync succeeds.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace

from svcproxy.model import NodeInfo, ServicePortKey
from svcproxy.sdk.backend import Backend, Changes, NodeState
from svcproxy.sdk.context import NodeContext
from svcproxy.sdk.health import ProxyHealth
from svcproxy.sdk.metrics import AgentMetrics
from svcproxy.sdk.source import StateSource

log = logging.getLogger(__name__)

# Called after each successful sync with (previously applied state, new state, the service
# ports that may differ between the two: every other one is the same in both).
AfterSync = Callable[[NodeState | None, NodeState, frozenset[ServicePortKey]], object]
# Called once an apply is complete (its post-sync steps run) with the state and the
# changes the backend was handed (the SDK's report to the frontend: svcproxy/sdk/report.py).
Applied = Callable[[NodeState, Changes], object]


class SyncRunner:
    """Drives one backend from one state source, in the thread that calls ``run``."""

    def __init__(
        self,
        source: StateSource,
        backend: Backend,
        *,
        health: ProxyHealth,
        sync_period: float = 30.0,
        min_sync_period: float = 1.0,
        metrics: AgentMetrics | None = None,
        after_sync: Sequence[AfterSync] = (),
        retry_initial: float = 1.0,
        poll: float = 0.2,
        clock: Callable[[], float] = time.monotonic,
        context: Callable[[NodeInfo | None], NodeContext] | None = None,
    ) -> None:
        self._source = source
        self._context = context
        self._backend = backend
        self._health = health
        self._metrics = metrics
        self._after_sync = tuple(after_sync)
        self._sync_period = sync_period
        self._min_period = min_sync_period
        self._retry_initial = retry_initial
        self._poll = poll
        self._clock = clock
        self._stop = threading.Event()
        self.applied_listeners: list[Applied] = []
        if metrics:
            metrics.track_pending(source.pending)

        self._dirty = False
        self._last_start: float | None = None
        self._last_change_start: float | None = None
        self._last_full: float | None = None
        self._retry_at: float | None = None
        self._backoff = retry_initial
        self._need_full = True
        self._latest: NodeState | None = None
        self._applied: NodeState | None = None
        self._carry_keys: set[ServicePortKey] = set()
        self._carry_node = False
        self._carry_triggers: list[float] = []

    @property
    def applied(self) -> NodeState | None:
        """The last state the backend applied successfully (post-sync steps included)."""
        return self._applied

    def stop(self) -> None:
        self._stop.set()

    def run(self) -> None:
        """Sync until ``stop`` is called."""
        while not self._stop.is_set():
            now = self._clock()
            self._notice()
            due, reason = self._next_due(now)
            if due is not None and due <= now:
                self._sync(reason)
            else:
                self._idle(None if due is None else due - now)

    def _notice(self) -> None:
        """Notice changes that came during the last sync (before a resync may be due)."""
        if not self._dirty and self._source.wait(0):
            self._dirty = True
            self._queued()

    def _next_due(self, now: float) -> tuple[float | None, str]:
        """When the next sync is due, and why (changes that are due go before a resync)."""
        if self._retry_at is not None:
            return self._retry_at, "retry"
        candidates: list[tuple[float, str]] = []
        if self._dirty:
            last = self._last_change_start
            start = now if last is None else last + self._min_period
            if start <= now:
                return start, "changes"
            candidates.append((start, "changes"))
        if self._last_full is not None:
            candidates.append((self._last_full + self._sync_period, "periodic"))
        refused = self._refused_due(now)
        if refused is not None:
            candidates.append((refused, "refused"))
        if not candidates:
            return None, ""
        return min(candidates)

    def _refused_due(self, now: float) -> float | None:
        """When the backend wants a sync to try refused service ports again (None: it
        does not); never sooner than ``min_sync_period`` after the last sync began."""
        retry_in = getattr(self._backend, "retry_in", None)
        delay = retry_in() if retry_in is not None and self._applied is not None else None
        if delay is None:
            return None
        last = self._last_start
        return max(now + delay, now if last is None else last + self._min_period)

    def _idle(self, timeout: float | None) -> None:
        """Wait for changes (or just for time to pass when some are already noticed)."""
        step = self._poll if timeout is None else max(0.0, min(timeout, self._poll))
        if self._dirty:
            self._stop.wait(step)
        elif self._source.wait(step):
            self._dirty = True
            self._queued()

    def _queued(self) -> None:
        self._health.queued()
        if self._metrics:
            self._metrics.queued()

    def _take(self) -> bool:
        """Fold what the source has into the next sync; False when it has no snapshot yet."""
        taken = self._source.take()
        self._dirty = False
        if taken is not None:
            state, changes = taken
            self._latest = state
            self._carry_keys |= changes.services
            self._carry_node |= changes.node_changed
            self._carry_triggers.extend(changes.trigger_times)
            self._need_full |= changes.full
            self._health.set_node_eligible(not (state.node and state.node.terminating))
        return self._latest is not None

    def _next_changes(self, state: NodeState, reason: str) -> Changes:
        full = self._need_full or reason in ("periodic", "retry")
        if full and reason == "changes":
            reason = "initial" if self._applied is None else "changes"
        keys = set(self._carry_keys)
        if full:
            keys |= state.services.keys()
        return Changes(
            services=frozenset(keys),
            node_changed=self._carry_node or full,
            full=full,
            reason=reason,
            trigger_times=tuple(self._carry_triggers),
        )

    def _sync(self, reason: str) -> None:
        if not self._take() or self._latest is None:
            self._retry_at = None
            return
        state = self._latest
        if self._context is not None:
            # The node context, resolved once for the backend; a new one is a node change.
            state = replace(state, context=self._context(state.node))
            if self._applied is not None and self._applied.context != state.context:
                self._carry_node = True
        changes = self._next_changes(state, reason)
        start = self._last_start = self._clock()
        if reason != "periodic":
            self._last_change_start = start
        try:
            self._backend.sync(state, changes)
        except Exception as err:  # noqa: BLE001 - any backend failure is retried
            self._failed(changes, err)
            return
        finally:
            if self._metrics:
                self._metrics.count_refusals()
        self._succeeded(state, changes, self._clock() - start)

    def _failed(self, changes: Changes, err: Exception) -> None:
        delay = min(max(self._backoff, self._min_period), self._sync_period)
        self._backoff = min(self._backoff * 2, self._sync_period)
        self._need_full = True
        self._retry_at = self._clock() + delay
        log.error(
            "Backend %s failed to apply a %s sync (%s): %s; retrying with a full sync in %.3gs",
            self._backend.name, "full" if changes.full else "partial", changes.reason, err, delay,
        )
        log.debug("Backend failure", exc_info=err)
        if self._metrics:
            self._metrics.sync_failures_total.inc()
        self._queued()

    def _succeeded(self, state: NodeState, changes: Changes, duration: float) -> None:
        previous = self._applied
        self._need_full = False
        self._retry_at = None
        self._backoff = self._retry_initial
        if changes.full:
            self._last_full = self._last_start
        self._carry_keys.clear()
        self._carry_node = False
        self._carry_triggers.clear()
        self._health.updated()
        if self._metrics:
            self._metrics.synced(
                previous, state, changes.services, changes.full, duration, changes.trigger_times
            )
        log.debug(
            "Synced %s (%s, %d service ports) in %.3fs",
            "fully" if changes.full else "partially", changes.reason, len(changes.services),
            duration,
        )
        changed = changes.services
        if changes.full and previous is not None:  # a reset may have dropped some unnamed
            changed = frozenset(changed | previous.services.keys())
        for hook in self._after_sync:
            try:
                hook(previous, state, changed)
            except Exception:  # noqa: BLE001 - one hook's failure must not stop the others
                log.exception("Post-sync step %s failed", getattr(hook, "__qualname__", hook))
        self._applied = state
        for listener in self.applied_listeners:
            try:
                listener(state, changes)
            except Exception:  # noqa: BLE001 - a listener never stops the sync loop
                log.exception("Apply listener %s failed",
                              getattr(listener, "__qualname__", listener))
