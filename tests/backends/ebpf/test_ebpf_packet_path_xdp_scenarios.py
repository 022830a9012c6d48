"""The shared scenario suite (tests/backends/test_scenarios.py) with ``--ebpf-packet-path
bpf --ebpf-xdp generic``: the XDP program in generic mode on node1's eth0 and br0 (veths
and a bridge) in front of the tc programs, every row test_ebpf_packet_path_scenarios
runs without it (the NodePort, externalIP, VIP, externalTrafficPolicy and REJECT rows
are those XDP changes; the cleanup row leaves no program behind).

Every pod and external client of the lab sends whole checksums
(tests.support.lab.checksums), so a packet the XDP program rewrote wrongly is dropped
by its receiver rather than passing unchecked.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.backends import test_scenarios as shared
from tests.backends.test_scenarios import *  # noqa: F403 - the shared scenarios, collected here
from tests.backends.test_scenarios import _local_state_equals_split_mode, _scenario_applies  # noqa: F401
from tests.support.lab.checksums import tx_checksums_off
from tests.support.lab.netns import ns_exec
from tests.support.netns.backends import BackendCase
from tests.support.netns.harness import ScenarioLab

CASE = BackendCase("ebpf", ("--ebpf-packet-path", "bpf", "--ebpf-devices", "eth0,br0",
                            "--ebpf-xdp", "generic"),
                   socket_level=True, label="ebpf-bpf-xdp")


@pytest.fixture(scope="module", params=(CASE,), ids=str)
def lab(request: pytest.FixtureRequest) -> Iterator[ScenarioLab]:
    if shared._why:
        pytest.skip(shared._why)
    scenario = ScenarioLab(request.param)
    try:
        scenario.start()
        for name in (*(p.name for p in scenario.spec.pods),
                     *(c.name for c in scenario.spec.clients)):
            tx_checksums_off(scenario.lab.ns(name))
        scenario.eventually(lambda: _attached(scenario))
        yield scenario
    finally:
        scenario.stop()


def _attached(lab: ScenarioLab) -> None:
    """The backend attached XDP to both devices in generic mode, as its log says."""
    log = lab.agent.tail(100000) if lab.agent is not None else ""
    for device in ("eth0", "br0"):
        assert f"XDP program attached to {device} in generic mode" in log, log


def test_after_cleanup_no_device_of_the_node_runs_xdp(lab: ScenarioLab) -> None:
    """Runs after the shared cleanup row (``svcproxy backend ebpf --cleanup``)."""
    assert lab.agent is None, "the cleanup row ran before this one"
    for device in ("eth0", "br0"):
        shown = ns_exec(lab.lab.ns("node1"), "ip", "-d", "link", "show", device)
        assert "xdp" not in shown, shown
