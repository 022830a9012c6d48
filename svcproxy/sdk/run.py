"""The smallest way to run a backend: watch, and call ``sync`` at each consistent point.

The node agent (``svcproxy backend NAME``, or :func:`svcproxy.sdk.run_agent`) adds rate
limiting, retries with backoff, health and metrics around the same loop; this is for
tools, tests and first steps::

    from svcproxy.sdk import NodeStateClient, run

    run.run(MyBackend(), NodeStateClient("127.0.0.1:12090", "node-a"))
"""

from __future__ import annotations

import logging
import threading

from svcproxy.sdk.backend import Backend, Changes, NodeState
from svcproxy.sdk.client import NodeStateClient

log = logging.getLogger(__name__)

RETRY_AFTER = 1.0


def run(backend: Backend, client: NodeStateClient,
        stop: threading.Event | None = None) -> None:
    """Feed ``backend`` until the client is stopped or ``stop`` is set.

    A client that was not started is started here, and stopped on return. A failed
    sync is logged and retried as a full sync at the next change or after a second.
    Raises the client's ``error`` (WatchRefused) when the frontend refused the request
    itself (an invalid node name): retrying cannot help.
    """
    owned = not client.started
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
                retry = not _sync(backend, *taken, retry=retry)
        if client.error is not None:
            raise client.error
    finally:
        if owned:
            client.stop()


def _sync(backend: Backend, state: NodeState, changes: Changes, *, retry: bool) -> bool:
    """One sync (a full one after a failure); False when it failed."""
    if retry:
        changes = Changes(frozenset(state.services), True, True, "retry", changes.trigger_times)
    try:
        backend.sync(state, changes)
    except Exception:
        log.exception("%s sync failed; retrying with a full sync", backend.name)
        return False
    return True
