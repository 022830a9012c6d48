"""Shared fixtures: an in-process frontend on a unix socket."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

from svcproxy.frontend.main import Frontend, FrontendOptions
from svcproxy.frontend.sources.events import Event
from svcproxy.loop_thread import LoopThread
from tests import root_sysctls

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


def wait_for(predicate: Callable[[], object], timeout: float = 10.0,
             interval: float = 0.02) -> None:
    """Poll until ``predicate()`` is true; fail the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    raise AssertionError(f"condition not met within {timeout}s")


class RunningFrontend:
    """A Frontend on its own event loop thread."""

    def __init__(self, opts: FrontendOptions) -> None:
        self.opts = opts
        self.frontend = Frontend(opts)
        self._loop = LoopThread("test-frontend")
        self.loop = self._loop.loop

    @property
    def engine(self) -> Any:
        return self.frontend.engine

    def start(self) -> RunningFrontend:
        self._loop.start()
        self._loop.call(self.frontend.start(), 10)
        return self

    def submit(self, events: Sequence[Event]) -> None:
        """Apply events on the loop and wait until they are published."""
        self._loop.run(lambda: self.engine.submit(events), 10)

    def records(self, node: str = "node-a") -> dict[Any, Any]:
        """``node``'s records as published now, read on the loop (its view made there on
        first use, as a client's watch makes it, never beside the loop's own work)."""
        return self._loop.run(lambda: dict(self.engine.changelog.view(node).records), 10)

    def stop(self) -> None:
        """Stop it (once: a test may stop it before the fixture does)."""
        if not self._loop.running:
            return
        self._loop.call(self.frontend.stop(), 30)  # a loaded 2-core machine: seconds
        self._loop.stop(5)


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
