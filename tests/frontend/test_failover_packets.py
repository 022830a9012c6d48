"""kill -9 of the frontend replica a node streams from, with real packets: the nft
backend moves to the other replica, a Service changed during the outage reaches the
kernel, and no connection through a ClusterIP fails meanwhile."""

from __future__ import annotations

import pytest

from tests.support.netns.failover import FailoverLab
from tests.support.netns.harness import missing_requirements

pytestmark = pytest.mark.netns
_why = missing_requirements()


def test_kill_9_of_a_replica_loses_no_connection() -> None:
    if _why:
        pytest.skip(_why)
    lab = FailoverLab()
    try:
        lab.start()
        kills = [lab.kill() for _ in range(3)]
        lab.stop_probing()
        assert lab.probes["ok"] > 0
        assert set(lab.probes) == {"ok"}, f"connections failed: {dict(lab.probes)}"
        for kill in kills:
            assert kill.moved < 2.0 and kill.applied < 2.0, kills
    finally:
        lab.stop()
