"""An asyncio event loop on a thread of its own, for running the frontend (or a part of
it) beside synchronous code: local mode's in-process frontend, the SDK's FakeCluster and
the tests' frontends."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine
from concurrent.futures import Future
from typing import Any, TypeVar

_T = TypeVar("_T")


class LoopThread:
    """``start`` runs the loop on a daemon thread named ``name``; ``submit``/``call`` run a
    coroutine on it, ``run`` a plain function; ``stop`` ends the loop and the thread."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def start(self) -> None:
        self._thread.start()

    def submit(self, coro: Coroutine[Any, Any, _T]) -> Future[_T]:
        """Run ``coro`` on the loop; its result is the future's."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def call(self, coro: Coroutine[Any, Any, _T], timeout: float) -> _T:
        """Run ``coro`` on the loop and wait for its result."""
        return self.submit(coro).result(timeout)

    def run(self, function: Callable[[], _T], timeout: float) -> _T:
        """Call ``function`` on the loop (between its other work) and wait for its result."""
        async def on_loop() -> _T:
            return function()
        return self.call(on_loop(), timeout)

    def stop(self, timeout: float = 10.0) -> None:
        """End the loop and wait for the thread (at most ``timeout`` seconds); the loop is
        closed once the thread has ended."""
        if not self._thread.is_alive():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout)
        if not self._thread.is_alive():
            self.loop.close()
