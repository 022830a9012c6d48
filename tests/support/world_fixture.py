"""The body of a fixture that hands a test a started world (a lab, its servers and
backends) and removes it afterwards, also when starting it or the test failed."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol, Self, TypeVar


class Startable(Protocol):
    """What a test's world does: ``start`` builds it, ``stop`` removes all it made."""

    def start(self) -> Self: ...

    def stop(self) -> None: ...


W = TypeVar("W", bound=Startable)


def running(world: W) -> Iterator[W]:
    """``world`` started, for a fixture to ``yield from``; stopped after the test, and
    stopped too when ``start`` fails half-way."""
    try:
        yield world.start()
    finally:
        world.stop()
