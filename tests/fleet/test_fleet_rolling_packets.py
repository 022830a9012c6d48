"""A rolling update through real packets (tests/support/netns/rolling.py): two nodes with the nft
backend, new connections all along through a ClusterIP (node1) and a NodePort (node2),
an endpoint made terminating and its server stopped, REPEATS times without and with a
preStop-style ``svcproxy wait --endpoint-gone``. Without the wait some connections fail
(the number is printed); with it none does."""

from __future__ import annotations

import os
from collections import Counter

import pytest

from svcproxy.v1 import nodestate_pb2 as pb
from tests.support.fleet_lab import wait_state
from tests.support.netns.harness import missing_requirements
from tests.support.netns.rolling import RollingLab

pytestmark = pytest.mark.netns
_why = missing_requirements()
REPEATS = int(os.environ.get("SVCPROXY_ROLLING_REPEATS", "20"))


def phase(lab: RollingLab, with_wait: bool) -> tuple[int, Counter[str], list[int]]:
    """Attempts and failures by kind over REPEATS rollouts and bring-backs, and each
    rollout's failures."""
    attempts, kinds = lab.counts()[0], lab.failure_kinds()
    each = []
    for _ in range(REPEATS):
        each.append(lab.roll_out(with_wait))
        lab.bring_back()
    return lab.counts()[0] - attempts, lab.failure_kinds() - kinds, each


def test_a_rolling_update_loses_no_connection_with_the_wait() -> None:
    if _why:
        pytest.skip(_why)
    lab = RollingLab()
    try:
        lab.start()
        tried_without, failed_without, each_without = phase(lab, with_wait=False)
        tried_with, failed_with, each_with = phase(lab, with_wait=True)
        print(f"\nrolling updates x{REPEATS}: without the wait "
              f"{sum(failed_without.values())} of {tried_without} new connections failed "
              f"({dict(failed_without)}; per rollout {each_without}); with it "
              f"{sum(failed_with.values())} of {tried_with} ({dict(failed_with)})")
        assert not failed_with, (each_with, dict(failed_with), lab.lab.logs())
        assert failed_without, "no connection failed without the wait: the test shows nothing"
        # The nft backends in their namespaces report: applied, with the frontend's digest.
        for node in ("node1", "node2"):
            got = wait_state(lab.api, node, pb.NODE_APPLIED)
            assert got.backend == "nft" and got.applied_digest == got.served_digest
            assert got.applied_revision == got.served_revision and not got.refused
    finally:
        lab.stop()
