"""WatchFleet and WaitFleet through a stream worker: the main process runs the stream,
the worker writes its messages to the client.

The fleet lives in the main process (reports reach whichever process a node called, and
are all answered there), so a worker that takes a WatchFleet or WaitFleet call asks the
main process to run it (``("fleet", id, method, request bytes, peer address)``; it holds
one of the peer's stream slots there, as any stream does) and writes each message
it gets back (``("fleet", id, message)``; ``None`` ends the stream, a ``Refused`` ends it
with that status). The main process takes the stream's next message only once the worker
has written the previous one (``("fleetnext", id)``), as the main process's own streams
do, so a client that reads slowly gets the newest state coalesced, never a queue. The
worker says ``("fleetend", id)`` when its client leaves; a worker that dies ends its
streams.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, cast

from svcproxy.frontend.admission.refusals import Refused
from svcproxy.frontend.admission.validation import Malformed, invalid, parse
from svcproxy.frontend.serving.pipe import Message
from svcproxy.v1 import nodestate_pb2 as pb

if TYPE_CHECKING:
    from svcproxy.frontend.serving.server import NodeStateServicer

REQUESTS = {"WatchFleet": pb.WatchFleetRequest, "WaitFleet": pb.WaitFleetRequest}


class LinkClosed(Exception):
    """The link between a worker and the main process closed while a fleet stream was open."""


@dataclass(slots=True)
class _Running:
    task: asyncio.Task[None] | None = None
    credit: asyncio.Event = field(default_factory=asyncio.Event)


class FleetRelay:
    """The main process's side, one per worker: runs its clients' fleet streams."""

    def __init__(self, servicer: NodeStateServicer, send: Callable[[Message], None]) -> None:
        self.servicer = servicer
        self.send = send
        self._streams: dict[int, _Running] = {}

    def on_message(self, message: Message) -> bool:
        """Take a worker's fleet message; False when it is not one."""
        kind, stream = message[0], cast(int, message[1])
        if kind == "fleet":
            method, data, peer = cast(tuple[str, bytes, str], message[2:5])
            self._start(stream, method, data, peer)
            return True
        running = self._streams.get(stream)
        if kind == "fleetnext":
            if running is not None:
                running.credit.set()
        elif kind == "fleetend":
            if running is not None:
                del self._streams[stream]
                assert running.task is not None
                running.task.cancel()
        else:
            return False
        return True

    def _start(self, stream: int, method: str, data: bytes, peer: str) -> None:
        running = self._streams[stream] = _Running()
        running.credit.set()  # the first message goes at once
        running.task = asyncio.ensure_future(self._run(stream, method, data, peer, running))

    def close(self) -> None:
        """The worker is gone: end its streams."""
        for running in self._streams.values():
            assert running.task is not None
            running.task.cancel()
        self._streams.clear()

    async def _run(self, stream: int, method: str, data: bytes, peer: str,
                   running: _Running) -> None:
        messages: AsyncIterator[bytes] | None = None
        slots = self.servicer.slots
        try:
            request = parse(REQUESTS[method], data)
            if isinstance(request, Malformed):
                raise invalid(method, request.message)
            await self.servicer.engine.synced.wait()
            slots.acquire(peer)
            fleet = self.servicer.fleet
            # Set once the slot is held: the finally gives both back.
            messages = (fleet.watch(request) if method == "WatchFleet"  # type: ignore[arg-type]
                        else fleet.wait(request))  # type: ignore[arg-type]
            while True:
                await running.credit.wait()
                running.credit.clear()
                msg = await anext(messages, None)
                self.send(("fleet", stream, msg))
                if msg is None:
                    return
        except Refused as err:
            self.send(("fleet", stream, err))
        finally:
            if messages is not None:
                slots.release(peer)
                await messages.aclose()  # type: ignore[attr-defined]
            self._streams.pop(stream, None)


class FleetFeeds:
    """The worker's side: each open fleet stream's messages from the main process."""

    def __init__(self, send: Callable[[Message], None]) -> None:
        self.send = send
        self._ids = itertools.count(1)
        self._queues: dict[int, asyncio.Queue[bytes | Refused | None | LinkClosed]] = {}
        self.closed = False

    async def open(self, method: str, data: bytes, peer: str) -> AsyncIterator[bytes]:
        """The stream's messages (the next is asked for when the caller comes back for
        it, having written this one); raises Refused as the main process ends the
        stream, LinkClosed when the main process is gone."""
        if self.closed:
            raise LinkClosed()
        stream = next(self._ids)
        queue: asyncio.Queue[bytes | Refused | None | LinkClosed] = asyncio.Queue()
        self._queues[stream] = queue
        self.send(("fleet", stream, method, data, peer))
        done = False
        try:
            while True:
                item = await queue.get()
                if item is None:
                    done = True
                    return
                if isinstance(item, (Refused, LinkClosed)):
                    done = True
                    raise item
                yield item
                if not self.closed:
                    self.send(("fleetnext", stream))
        finally:
            self._queues.pop(stream, None)
            if not done and not self.closed:
                self.send(("fleetend", stream))

    def deliver(self, message: Message) -> None:
        """A ``("fleet", id, item)`` from the main process."""
        queue = self._queues.get(cast(int, message[1]))
        if queue is not None:
            queue.put_nowait(cast("bytes | Refused | None", message[2]))

    def close(self) -> None:
        """The main process is gone: end every stream."""
        self.closed = True
        for queue in self._queues.values():
            queue.put_nowait(LinkClosed())
