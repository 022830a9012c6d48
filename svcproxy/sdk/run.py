"""The smallest way to run a backend: watch, and call ``sync`` at each consistent point.

The node agent (``svcproxy backend NAME``) adds rate limiting, retries, health
and metrics around the same loop; this is for tools, tests and first steps.
"""

from __future__ import annotations

import logging

from svcproxy.sdk.backend import Backend, Changes
from svcproxy.sdk.client import NodeStateClient

log = logging.getLogger(__name__)


def run(backend: Backend, client: NodeStateClient) -> None:
    """Feed ``backend`` until the client stops; a failed sync is retried as a full sync."""
    retry = False
    for state, changes in client.updates(timeout=1.0):
        if retry:
            changes = Changes(frozenset(state.services), True, True, "retry",
                              changes.trigger_times)
        try:
            backend.sync(state, changes)
            retry = False
        except Exception:
            log.exception("%s sync failed; retrying with a full sync", backend.name)
            retry = True
