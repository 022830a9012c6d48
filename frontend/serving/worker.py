"""A stream worker process: serves Watch streams from views the main process feeds.

See workers.py for the design. Everything here runs in the worker: its link to the
main process (requests with futures, published batches into local views) and the
servicer its gRPC server calls.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import signal
import sys
from contextlib import aclosing
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import cast

import grpc
from grpc_health.v1 import _async as health_aio

from svcproxy.frontend.admission.refusals import Refused
from svcproxy.frontend.publication.views import VIEW_HISTORY_BYTES, NodeView
from svcproxy.frontend.runtime.gctuning import tune_for_streaming
from svcproxy.frontend.serving.access.guard import CallGuard
from svcproxy.frontend.serving.fleet_streams import FleetFeeds, LinkClosed
from svcproxy.frontend.serving.limits import (
    AnswerBudget,
    RefusalDelay,
    StallWatch,
    StreamLimits,
    WriteClock,
    peer_address,
)
from svcproxy.frontend.serving.pages import PAGE_BYTES
from svcproxy.frontend.serving.pipe import Message, Pipe
from svcproxy.frontend.serving.readiness import API_NAMES, SERVING, not_serving
from svcproxy.frontend.serving.server import TLSFiles, api_handler, serve_api
from svcproxy.frontend.serving.shipping import Tally
from svcproxy.frontend.serving.stream import Messages, WatchServicer, write_stream
from svcproxy.v1 import nodestate_pb2 as pb

log = logging.getLogger(__name__)
METRICS_INTERVAL = 1.0  # seconds between a worker's metrics reports


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    listen: str
    tls: TLSFiles | None
    history: int
    log_level: int
    guard: CallGuard | None = None
    write_timeout: float = 60.0
    # A view's copy here keeps at most what the main process's view keeps
    # (ViewBounds.view_history_bytes: an eighth of --history-max-bytes).
    view_history_bytes: int = VIEW_HISTORY_BYTES


class MainProcessGone(Exception):
    """The pipe to the main process closed."""


class ParentLink:
    """Requests to the main process, and the views its published batches feed."""

    def __init__(self, conn: Connection, history: int,
                 history_bytes: int = VIEW_HISTORY_BYTES) -> None:
        self.pipe = Pipe(conn, self._on_message, self._on_closed)
        self.history = history
        self.history_bytes = history_bytes
        self.views: dict[str, NodeView] = {}
        self.closed = asyncio.Event()
        self.fleet = FleetFeeds(self.pipe.send)
        self._ids = itertools.count(1)
        # A request's future, its kind and, for a watch, the view and peer it is for.
        self._pending: dict[int, tuple[asyncio.Future[object], str,
                                       tuple[str, str] | None]] = {}

    def start(self) -> None:
        self.pipe.start(asyncio.get_running_loop())

    def request(self, kind: str, *args: object, watch: tuple[str, str] | None = None
                ) -> asyncio.Future[object]:
        if self.closed.is_set():
            raise MainProcessGone()
        req = next(self._ids)
        future: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        self._pending[req] = (future, kind, watch)
        self.pipe.send((kind, req, *args))
        return future

    async def watch(self, name: str, since: int, peer: str) -> tuple[NodeView, int, Messages]:
        """Start a stream of ``peer`` (its address): the local view (held for it), its
        cursor and first messages; Refused by the main process (caps, requests)."""
        watch = (name, peer)
        reply = await self._answer(self.request("watch", name, since, peer, watch=watch),
                                   watch)
        if isinstance(reply, Refused):
            raise reply
        view, cursor, first, feed = cast(tuple[NodeView, int, list[bytes], int], reply)
        return view, cursor, self.messages(first, feed)

    async def catch_up(self, name: str, since: int) -> tuple[int, Messages]:
        """Where a stream goes on when the worker's view no longer has its batches."""
        cursor, first, feed = cast(tuple[int, list[bytes], int],
                                   await self._answer(self.request("catchup", name, since)))
        return cursor, self.messages(first, feed)

    async def _answer(self, future: asyncio.Future[object],
                      watch: tuple[str, str] | None = None) -> object:
        """A watch or catch-up request's answer. A stream that ends once the answer came
        but before it read it (its call cancelled meanwhile) gives back what the answer
        holds: the view's count, the peer's slot, the snapshot the main process keeps."""
        try:
            return await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self._give_back(watch, future.result())
            raise

    def messages(self, first: list[bytes], feed: int) -> Messages:
        return SnapshotFeed(self, first, feed) if feed else first

    def release(self, peer: str) -> None:
        """A stream of ``peer`` is over: its slot is free."""
        if not self.closed.is_set():
            self.pipe.send(("release", peer))

    def unwatch(self, view: NodeView) -> None:
        view.watchers -= 1
        name = view.name
        if not view.watchers and self.views.get(name) is view:
            del self.views[name]
        if not self.closed.is_set():
            self.pipe.send(("unwatch", name))

    def _on_message(self, message: Message) -> None:
        if message[0] == "fleet":
            self.fleet.deliver(message)
            return
        if message[0] == "publish":
            revision, batches = message[1], message[2]
            for name, (ops, digest) in batches.items():  # type: ignore[attr-defined]
                view = self.views.get(name)
                if view is not None:
                    view.append(revision, ops, digest)
            return
        future, kind, watch = self._pending.pop(message[1])  # type: ignore[arg-type]
        reply = message[2]
        if future.done():
            # The stream left while waiting: the main process counted it (and may keep a
            # snapshot for it): give that back.
            if kind in ("watch", "catchup"):
                self._give_back(watch, reply)
            return
        if watch is not None and not isinstance(reply, Refused):
            # Made here, not when the caller resumes: batches after this reply are
            # already on their way and must find the view.
            cursor, first, feed = reply  # type: ignore[misc]
            view = self.views.get(watch[0])
            if view is None:
                view = self.views[watch[0]] = NodeView(watch[0], cursor, self.history,
                                                         self.history_bytes)
            view.watchers += 1
            reply = (view, cursor, first, feed)
        future.set_result(reply)

    def _give_back(self, watch: tuple[str, str] | None, reply: object) -> None:
        """Uncount a watch or catch-up answer no stream read: a refusal counted nothing."""
        if isinstance(reply, Refused):
            return
        answer = cast(tuple[object, ...], reply)
        if watch is not None:
            if isinstance(answer[0], NodeView):
                self.unwatch(answer[0])
            elif not self.closed.is_set():
                self.pipe.send(("unwatch", watch[0]))
            self.release(watch[1])
        feed = answer[-1]
        if feed and not self.closed.is_set():
            self.pipe.send(("drop", feed))

    def _on_closed(self) -> None:
        self.closed.set()
        self.fleet.close()
        for future, _, _ in self._pending.values():
            if not future.done():
                future.set_exception(MainProcessGone())
        self._pending.clear()


class SnapshotFeed:
    """A snapshot's messages, asked of the main process one at a time as the stream
    writes them (the worker holds one message of it)."""

    def __init__(self, link: ParentLink, first: list[bytes], feed: int) -> None:
        self.link = link
        self.first = first
        self.feed = feed

    def __aiter__(self) -> SnapshotFeed:
        return self

    async def __anext__(self) -> bytes:
        if self.first:
            return self.first.pop(0)
        if not self.feed:
            raise StopAsyncIteration
        msgs = await self.link.request("next", self.feed)
        if not msgs:
            self.feed = 0
            raise StopAsyncIteration
        return msgs[0]  # type: ignore[index]

    def close(self) -> None:
        """The stream ended before the snapshot did: the main process may forget it."""
        if self.feed and not self.link.closed.is_set():
            self.link.pipe.send(("drop", self.feed))
        self.feed = 0


class WorkerServicer(WatchServicer):
    """The API as a stream worker serves it."""

    def __init__(self, link: ParentLink, write_timeout: float = 60.0) -> None:
        self.link = link
        self.stalls = StallWatch(write_timeout)
        limits = StreamLimits()
        self.answers = AnswerBudget(limits.answer_bytes_per_peer, limits.answer_bytes_total,
                                    PAGE_BYTES)
        self.delays = RefusalDelay()

    async def stream(self, name: str, since: int, context: grpc.aio.ServicerContext,
                     clock: WriteClock) -> None:
        peer = context.peer()
        address = peer_address(peer)
        log.info("watch from %s for %s since revision %d", peer, name or "<cluster>", since)
        try:
            view, cursor, first = await self.link.watch(name, since, address)
        except MainProcessGone:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "the frontend is restarting")
        context.add_done_callback(lambda _: self.link.release(address))
        feeds = [first]

        async def resync(at: int) -> tuple[int, Messages]:
            cursor, msgs = await self.link.catch_up(name, at)
            feeds.append(msgs)
            return cursor, msgs

        try:
            await write_stream(context, view, cursor, first, resync, clock)
        finally:
            for feed in feeds:
                if isinstance(feed, SnapshotFeed):
                    feed.close()
            self.link.unwatch(view)
            log.info("watch from %s for %s ended", peer, name or "<cluster>")

    async def GetNodeState(self, request: bytes,  # noqa: N802
                           context: grpc.aio.ServicerContext) -> bytes:
        return await self._unary("GetNodeState", request, context)

    async def ListNodes(self, request: bytes,  # noqa: N802
                        context: grpc.aio.ServicerContext) -> bytes:
        return await self._unary("ListNodes", request, context)

    async def Report(self, request: bytes,  # noqa: N802
                     context: grpc.aio.ServicerContext) -> bytes:
        return await self._unary("Report", request, context)

    async def GetFleet(self, request: bytes,  # noqa: N802
                       context: grpc.aio.ServicerContext) -> bytes:
        return await self._unary("GetFleet", request, context)

    async def WatchFleet(self, request: pb.WatchFleetRequest,  # noqa: N802
                         context: grpc.aio.ServicerContext) -> None:
        await self._fleet("WatchFleet", request, context)

    async def WaitFleet(self, request: pb.WaitFleetRequest,  # noqa: N802
                        context: grpc.aio.ServicerContext) -> None:
        await self._fleet("WaitFleet", request, context)

    async def _fleet(self, method: str, request: pb.WatchFleetRequest | pb.WaitFleetRequest,
                     context: grpc.aio.ServicerContext) -> None:
        """A fleet stream the main process runs; its messages written here."""
        try:
            data, peer = request.SerializeToString(), peer_address(context.peer())
            async with aclosing(self.link.fleet.open(method, data, peer)) as messages:
                async for msg in messages:
                    await context.write(msg)
        except Refused as err:
            await err.abort(context)
        except LinkClosed:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "the frontend is restarting")

    async def _unary(self, method: str, request: bytes,
                     context: grpc.aio.ServicerContext) -> bytes:
        peer = peer_address(context.peer())
        try:
            self.answers.admit(peer)
            reply = await self.link.request("unary", method, request, peer)
            if isinstance(reply, Refused):
                raise reply
            return self.answers.hold(context, peer, reply)  # type: ignore[arg-type]
        except Refused as err:
            await self.delays.hold(peer, err)
            await err.abort(context)
            raise


async def _serve(index: int, config: WorkerConfig, conn: Connection) -> None:
    link = ParentLink(conn, config.history, config.view_history_bytes)
    link.start()
    health = await not_serving()
    server, _ = await serve_api(api_handler(WorkerServicer(link, config.write_timeout),
                                            raw_unary=True),
                                config.listen, config.tls, config.guard, health)
    synced = asyncio.ensure_future(_serving_once_synced(link, health))
    log.info("stream worker %d serving %s", index, config.listen)
    link.pipe.send(("ready",))
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, link.closed.set)
    shipping = asyncio.ensure_future(_ship_metrics(link))
    await link.closed.wait()
    shipping.cancel()
    synced.cancel()
    await server.stop(grace=1)


async def _serving_once_synced(link: ParentLink, health: health_aio.HealthServicer) -> None:
    """Health says SERVING once the main process has synced (as its own health does)."""
    try:
        await link.request("synced")
    except MainProcessGone:
        return
    for name in API_NAMES:
        await health.set(name, SERVING)


async def _ship_metrics(link: ParentLink) -> None:
    """Send what this worker counted to the main process, which serves /metrics."""
    tally = Tally()
    while not link.closed.is_set():
        await asyncio.sleep(METRICS_INTERVAL)
        shipment = tally.take()
        if shipment is not None and not link.closed.is_set():
            link.pipe.send(("metrics", shipment))


def worker_main(index: int, config: WorkerConfig, conn: Connection) -> None:
    """Entry point of a stream worker process."""
    logging.basicConfig(level=config.log_level, stream=sys.stderr,
                        format=f"%(asctime)s %(levelname)s %(name)s[worker {index}]: "
                        "%(message)s")
    tune_for_streaming()
    asyncio.run(_serve(index, config, conn))
