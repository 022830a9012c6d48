"""Shared fixtures: an in-process frontend on a unix socket."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

from svcproxy.frontend.main import FrontendOptions
from tests.support import root_sysctls
from tests.support.frontend import RunningFrontend

# No property depends on how fast the machine is: no per-example deadline, and no health
# check that times data generation (both fail on a loaded machine, never on a wrong product).
settings.register_profile("svcproxy", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("svcproxy")


def _untouched(before: dict[str, str], during: str) -> None:
    diff = root_sysctls.changed(before, root_sysctls.read())
    if diff:
        root_sysctls.restore(diff)
        pytest.fail(f"the root network namespace's sysctls changed during {during} (put "
                    f"back): {diff}", pytrace=False)


@pytest.fixture(autouse=True, scope="session")
def _root_namespace_sysctls_untouched_by_the_session() -> Iterator[None]:
    """As below, around the whole run (module fixtures such as the scenario labs too)."""
    before = root_sysctls.read()
    yield
    _untouched(before, "this test session")


@pytest.fixture(autouse=True)
def _root_namespace_sysctls_untouched() -> Iterator[None]:
    """No test writes the machine's own network sysctls (only those of namespaces it made)."""
    before = root_sysctls.read()
    yield
    _untouched(before, "this test")


@pytest.fixture
def frontend_factory(tmp_path: Path) -> Iterator[Callable[..., RunningFrontend]]:
    started: list[RunningFrontend] = []

    def make(manifests: Path | None, **kw: Any) -> RunningFrontend:
        sock = tmp_path / f"api{len(started)}.sock"
        kw.setdefault("listen", f"unix://{sock}")
        opts = FrontendOptions(manifests=manifests, metrics_bind_address="", **kw)
        fe = RunningFrontend(opts).start()
        started.append(fe)
        return fe

    yield make
    for fe in started:
        try:
            fe.stop()
        except Exception:
            pass
