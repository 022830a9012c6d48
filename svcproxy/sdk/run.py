"""The smallest way to run a backend: watch, and call ``sync`` at each consistent point.

The node agent (``svcproxy backend NAME``, or :func:`svcproxy.sdk.run_agent`) adds rate
limiting, retries with backoff, health and metrics around the same loop; this is for
tools, tests and first steps. Both report each apply to the frontend (``report.py``:
what the node holds, its refusals, at most every ``report_min_interval``), so the fleet
view knows this node with no code of the backend's::

    from svcproxy.sdk import NodeStateClient, run

    run.run(MyBackend(), NodeStateClient("127.0.0.1:12090", "node-a"))
"""

from __future__ import annotations

import logging
import threading

from svcproxy.sdk.backend import Backend, Changes, NodeState
from svcproxy.sdk.client import NodeStateClient
from svcproxy.sdk.report import Reporter

log = logging.getLogger(__name__)

RETRY_AFTER = 1.0


def run(backend: Backend, client: NodeStateClient, stop: threading.Event | None = None,
        report_min_interval: float = 1.0) -> None:
    """Feed ``backend`` until the client is stopped or ``stop`` is set.

    A client that was not started is started here, and stopped on return. A failed
    sync is logged and retried as a full sync at the next change or after a second.
    Each sync that succeeded is reported to the frontend, at most every
    ``report_min_interval`` seconds (newer applies replace a report not sent yet).
    Raises the client's ``error`` (WatchRefused) when the frontend refused the request
    itself (an invalid node name): retrying cannot help.
    """
    owned = not client.started
    reporter = Reporter(client, backend, report_min_interval)
    reporter.start()
    if owned:
        client.start()
    log.info("%s: waiting for the state of node %s from %s", backend.name,
             client.node_name or "<cluster>", client.target)
    retry = False
    try:
        while not client.stopped and not (stop is not None and stop.is_set()):
            if not client.wait(timeout=RETRY_AFTER) and not retry:
                continue
            taken = client.take()
            if taken is not None:
                state, changes = taken
                if retry:
                    changes = Changes(frozenset(state.services), True, True, "retry",
                                      changes.trigger_times)
                retry = not _sync(backend, state, changes)
                if not retry:
                    reporter.applied(state, changes)
        if client.error is not None:
            raise client.error
    finally:
        if owned:
            client.stop()
        reporter.stop()


def _sync(backend: Backend, state: NodeState, changes: Changes) -> bool:
    """One sync; False when it failed."""
    try:
        backend.sync(state, changes)
    except Exception:
        log.exception("%s sync failed; retrying with a full sync", backend.name)
        return False
    return True
