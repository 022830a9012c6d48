"""The shared scenario suite (tests/backends/test_scenarios.py) with ``--ebpf-packet-path bpf``: the
socket programs for node1's processes and pods in the cgroup, the tc programs on node1's
eth0 and pod bridge br0 for everything else, no nft next to them.

The scenarios are the shared module's own functions, collected here with this module's
``lab`` fixture; the rows the packet path does not serve yet are skipped with the
reason (docs/ebpf-packet-path.md lists them too).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.backends import test_scenarios as shared
from tests.backends.test_scenarios import *  # noqa: F403 - the shared scenarios, collected here
from tests.backends.test_scenarios import _local_state_equals_split_mode, _scenario_applies  # noqa: F401
from tests.support.netns.backends import BackendCase
from tests.support.netns.harness import ScenarioLab
from tests.support.world_fixture import running

NOT_YET: tuple[tuple[str, str], ...] = ()
CASE = BackendCase("ebpf", ("--ebpf-packet-path", "bpf", "--ebpf-devices", "eth0,br0"),
                   socket_level=True, label="ebpf-bpf",
                   not_applicable=NOT_YET)


@pytest.fixture(scope="module", params=(CASE,), ids=str)
def lab(request: pytest.FixtureRequest) -> Iterator[ScenarioLab]:
    if shared._why:
        pytest.skip(shared._why)
    yield from running(ScenarioLab(request.param))
