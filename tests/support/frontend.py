"""An in-process frontend on its own event loop thread."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from svcproxy.frontend.main import Frontend, FrontendOptions
from svcproxy.frontend.sources.events import Event
from svcproxy.loop_thread import LoopThread


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
