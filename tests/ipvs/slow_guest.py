"""pytest plugin for the emulated IPVS guest: Python runs 20-25x slower there, so the
shared scenario suite's waits (process start-up, "eventually") are stretched.

Loaded with ``-p tests.ipvs.slow_guest`` by tests/test_ipvs_vm.py; only wait
bounds change, never what the tests assert. The factor comes from
SVCPROXY_IPVS_GUEST_TIME_SCALE (default 8).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

SCALE = float(os.environ.get("SVCPROXY_IPVS_GUEST_TIME_SCALE", "8"))


def _stretch(function: Callable[..., Any], name: str) -> None:
    """Multiply the default of keyword ``name`` of ``function`` by SCALE."""
    code = function.__code__
    params = code.co_varnames[: code.co_argcount]
    defaults = list(function.__defaults__ or ())
    index = params.index(name) - (len(params) - len(defaults))
    defaults[index] = defaults[index] * SCALE
    function.__defaults__ = tuple(defaults)


def pytest_configure() -> None:
    from svcproxy.lab import processes
    from tests.netns import harness

    _stretch(processes.wait_for_path, "timeout")
    _stretch(harness.ScenarioLab.eventually, "timeout")
