"""The apiserver source started before the engine exists: its list requests go out while
the rest of the frontend (gRPC, the engine, the metrics) is still being imported, and
the pages it reads are held until the engine's sink is known. Only what listing needs
is imported here: the kubernetes client."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from svcproxy.frontend.sources.events import Event, Sink

if TYPE_CHECKING:
    from svcproxy.frontend.sources.apiserver import ApiserverSource


class HeldSink:
    """Holds the events it is given until ``connect`` names the sink they are for."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: list[Event] = []
        self._sink: Sink | None = None

    def __call__(self, events: Sequence[Event]) -> None:
        with self._lock:
            if self._sink is None:
                self._held.extend(events)
            else:
                self._sink(events)

    def connect(self, sink: Sink) -> None:
        """Hand on what was held, in order, then every batch as it comes."""
        with self._lock:
            if self._held:
                sink(self._held)
            self._held = []
            self._sink = sink


@dataclass(frozen=True, slots=True)
class EarlySource:
    """A started apiserver source and the sink holding its events."""

    source: ApiserverSource
    sink: HeldSink


def start_listing(kubeconfig: str | None, master: str = "") -> EarlySource:
    """The apiserver source (see ``load_api_client``), started; raises
    ApiserverConfigError."""
    from svcproxy.frontend.sources.apiserver import ApiserverSource

    sink = HeldSink()
    source = ApiserverSource(sink, kubeconfig=kubeconfig, master=master)
    source.start()
    return EarlySource(source, sink)
