"""pytest plugin for the emulated IPVS guest: Python runs 20-25x slower there, so the
shared scenario suite's waits (process start-up, local mode's cold start and state
comparison, a --cleanup process, "eventually", the default wait for an answer) are
stretched; explicit timeouts (those that check for drops) are kept.

Loaded with ``-p tests.support.ipvs.slow_guest`` by tests/backends/ipvs/test_ipvs_vm.py; only wait
bounds change, never what the tests assert. The factor comes from
SVCPROXY_IPVS_GUEST_TIME_SCALE (default 8).

One scenario checks a behaviour IPVS does not have, so it is marked as an
expected failure for ipvs and ipvs-local (strict: it is reported if it ever passes).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

import pytest

_PERSISTENCE = (
    "IPVS persistence: the template outlives timeoutSeconds while connections it created "
    "are still tracked (TIME_WAIT lasts 2 minutes in IPVS), as in kube-proxy's IPVS mode; "
    "the test waits 30 s")
KNOWN_DIFFERENCES = {
    f"test_session_affinity_client_ip_until_timeout[{case}]": _PERSISTENCE
    for case in ("ipvs", "ipvs-local")
}
OPEN_ISSUES: dict[str, str] = {}
SCALE = float(os.environ.get("SVCPROXY_IPVS_GUEST_TIME_SCALE", "8"))


def _stretch(function: Callable[..., Any], name: str, scale: float = SCALE) -> None:
    """Multiply the default of keyword ``name`` of ``function`` by ``scale``."""
    code = function.__code__
    params = code.co_varnames[: code.co_argcount]
    defaults = list(function.__defaults__ or ())
    index = params.index(name) - (len(params) - len(defaults))
    defaults[index] = defaults[index] * scale
    function.__defaults__ = tuple(defaults)


def pytest_configure() -> None:
    from tests.support.lab import processes
    from tests.support.netns import harness

    # A process's start (the frontend's socket) took over 120 s in the guest at load 12.
    _stretch(processes.wait_for_path, "timeout", SCALE * 2.5)
    _stretch(harness.ScenarioLab.eventually, "timeout")
    _stretch(harness.ScenarioLab.probe, "timeout")
    _stretch(harness.ScenarioLab.assert_same_state, "timeout")
    harness.LOCAL_COLD_START *= SCALE
    harness.CLEANUP_TIMEOUT *= SCALE


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        reason = KNOWN_DIFFERENCES.get(item.name)
        if reason:
            item.add_marker(pytest.mark.xfail(reason=reason, strict=True))
        reason = OPEN_ISSUES.get(item.name)
        if reason:
            item.add_marker(pytest.mark.xfail(reason=reason, strict=False))


def _now() -> str:
    """Wall-clock time as the backend's log lines show it (to order the dump and the log)."""
    import datetime

    return datetime.datetime.now().isoformat(sep=" ", timespec="milliseconds")


def _node_dump() -> str:
    """The IPVS programming of every scenario node namespace (for failure reports)."""
    import subprocess

    out = []
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    for ns in (line.split()[0] for line in names.splitlines() if "node1" in line):
        for argv in (["iptables-save"], ["ipset", "list", "-t"],
                     ["ipset", "list", "KUBE-EXTERNAL-LOCAL-FWMARK"], ["ip", "addr"],
                     [sys.executable, "-c", _IPVS_DUMP]):
            done = subprocess.run(["ip", "netns", "exec", ns, *argv], capture_output=True,
                                  text=True)
            out.append(f"== {_now()} {ns}: {' '.join(argv[:3])}\n{done.stdout}{done.stderr}")
    for ns in (line.split()[0] for line in names.splitlines()
               if line.split()[0].endswith(("-node1", "-pod-a", "-pod-b", "-client"))):
        for argv in (["sysctl", "-a", "--pattern", "redirect|bridge|vs\\.|forward"],
                     ["nstat", "-asz"], ["ip", "route", "show", "cache"],
                     ["ip", "-6", "route", "show", "cache"], ["ip", "neigh"]):
            done = subprocess.run(["ip", "netns", "exec", ns, *argv], capture_output=True,
                                  text=True)
            out.append(f"== {_now()} {ns}: {' '.join(argv)}\n{done.stdout}{done.stderr}")
    mods = subprocess.run(["grep", "-E", "br_netfilter|bridge|ip_vs ", "/proc/modules"],
                          capture_output=True, text=True)
    out.append(f"== modules\n{mods.stdout}")
    logs = subprocess.run("grep -h -i sysctl /tmp/sp*/backend.log; "
                          "tail -n 40 /tmp/sp*/backend.log", shell=True, capture_output=True,
                          text=True)
    out.append(f"== backend logs\n{logs.stdout}")
    return "\n".join(out)


_IPVS_DUMP = """
from svcproxy.backends.ipvs.netlink import IpvsNetlink
s = IpvsNetlink()
for v in s.services():
    print(v, [(str(d.id), d.weight, d.active, d.inactive) for d in s.dests(v.id)])
"""


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    outcome = yield
    report = outcome.get_result()
    if report.when == "call" and report.failed and item.name.endswith(("[ipvs]", "[ipvs-local]")):
        report.sections.append(("node1 IPVS programming", _node_dump()))
