"""Stream workers, the main process's side: more processes serving Watch streams.

The main process runs the sources and the engine. With ``--stream-workers N`` it also
starts N-1 worker processes that serve the same TCP port (SO_REUSEPORT), so the kernel
spreads the nodes' connections over N processes and gRPC Python's per-message cost
(tens of microseconds) is paid on N cores instead of one.

A worker holds nothing but the views its own clients watch. A new stream asks the main
process where to start (``Snapshots.catch_up``: the batches it missed, or a snapshot) and
subscribes its worker to that view; from then on every batch of the view is sent to the
worker (already-serialised ops, pickled once per worker and revision), in the same
pipe and so in the same order as the answers. Unary calls are forwarded here (each
peer's rate is counted here, across processes), WatchFleet and WaitFleet are run here
and their messages written by the worker (fleet_streams.py), and
each worker reports its metrics here every second, so /metrics covers every process.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import multiprocessing
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from functools import partial
from multiprocessing.process import BaseProcess

from svcproxy.frontend.admission.refusals import Refused
from svcproxy.frontend.admission.validation import Malformed, invalid, parse
from svcproxy.frontend.pipeline.engine import Engine
from svcproxy.frontend.publication.wire import WireOp
from svcproxy.frontend.serving import shipping
from svcproxy.frontend.serving.access.guard import CallGuard
from svcproxy.frontend.serving.fleet_streams import FleetRelay
from svcproxy.frontend.serving.pipe import Message, Pipe
from svcproxy.frontend.serving.server import REQUESTS, NodeStateServicer, TLSFiles
from svcproxy.frontend.serving.worker import WorkerConfig, worker_main

log = logging.getLogger(__name__)
RESPAWN_DELAY = 1.0


def tcp_address(listen: str, port: int) -> str:
    """HOST:PORT of the port the main process bound; stream workers need TCP."""
    if listen.startswith("unix:"):
        raise ValueError(f"--stream-workers needs a TCP --listen address, not {listen}")
    host = listen.rpartition(":")[0]
    return f"{host}:{port}"


@dataclass
class _Worker:
    index: int
    process: BaseProcess
    pipe: Pipe = field(init=False)
    ready: bool = False
    watching: Counter[str] = field(default_factory=Counter)
    # Stream slots its streams hold, by peer address; snapshots it is reading, by id.
    peers: Counter[str] = field(default_factory=Counter)
    feeds: dict[int, Iterator[bytes]] = field(default_factory=dict)
    # Its clients' WatchFleet and WaitFleet streams, run here.
    fleet: FleetRelay | None = None


class StreamWorkers:
    """Starts, feeds, answers and (when one dies) restarts the stream workers."""

    def __init__(self, engine: Engine, count: int, address: str, tls: TLSFiles | None,
                 log_level: int = logging.INFO, guard: CallGuard | None = None,
                 servicer: NodeStateServicer | None = None) -> None:
        self.engine = engine
        self.count = count
        # The main process's servicer: one count of streams against the caps.
        self._servicer = servicer or NodeStateServicer(engine)
        self.config = WorkerConfig(address, tls, engine.changelog.history_limit, log_level, guard,
                                   self._servicer.limits.write_timeout,
                                   engine.changelog.bounds.view_history_bytes)
        self._feeds = itertools.count(1)
        self._workers: dict[int, _Worker] = {}
        self._stopping = False
        self._tasks: set[asyncio.Task[None]] = set()

    def start(self) -> None:
        for index in range(1, self.count):
            self._spawn(index)
        self.engine.changelog.listeners.append(self._on_publish)
        log.info("%d stream workers serving %s with this process", self.count - 1,
                 self.config.listen)

    async def stop(self) -> None:
        self._stopping = True
        for worker in list(self._workers.values()):
            worker.pipe.close()
            worker.process.terminate()
        for worker in list(self._workers.values()):
            await asyncio.get_running_loop().run_in_executor(None, worker.process.join, 5)
        self._workers.clear()

    @property
    def pids(self) -> list[int | None]:
        """The workers that are serving."""
        return [w.process.pid for w in self._workers.values() if w.ready]

    def _spawn(self, index: int) -> None:
        ctx = multiprocessing.get_context("spawn")
        ours, theirs = ctx.Pipe()
        process = ctx.Process(target=worker_main, args=(index, self.config, theirs),
                              name=f"svcproxy-stream-worker-{index}", daemon=True)
        process.start()
        theirs.close()
        worker = _Worker(index, process)
        worker.pipe = Pipe(ours, partial(self._on_message, worker),
                           partial(self._on_closed, worker))
        worker.fleet = FleetRelay(self._servicer, worker.pipe.send)
        worker.pipe.start(asyncio.get_running_loop())
        self._workers[index] = worker

    def _on_closed(self, worker: _Worker) -> None:
        for name in worker.watching.elements():
            self._release(name)
        worker.watching.clear()
        for peer in worker.peers.elements():
            self._servicer.slots.release(peer)
        worker.peers.clear()
        worker.feeds.clear()
        if worker.fleet is not None:
            worker.fleet.close()
        self._workers.pop(worker.index, None)
        if self._stopping:
            return
        log.error("stream worker %d (pid %s) exited with %s; its clients reconnect to the "
                  "other processes, and it is restarted in %.0f s", worker.index,
                  worker.process.pid, worker.process.exitcode, RESPAWN_DELAY)
        asyncio.get_running_loop().call_later(RESPAWN_DELAY, self._respawn, worker.index)

    def _respawn(self, index: int) -> None:
        if not self._stopping and index not in self._workers:
            self._spawn(index)

    def _on_message(self, worker: _Worker, message: Message) -> None:
        kind = message[0]
        if kind == "ready":
            worker.ready = True
            return
        if kind == "unwatch":
            self._unwatch(worker, str(message[1]))
            return
        if kind == "release":
            self._release_slot(worker, str(message[1]))
            return
        if kind == "drop":
            worker.feeds.pop(int(message[1]), None)  # type: ignore[call-overload]
            return
        if kind == "metrics":
            shipping.receive(message[1])  # type: ignore[arg-type]
            return
        if worker.fleet is not None and worker.fleet.on_message(message):
            return
        task = asyncio.ensure_future(self._answer(worker, message))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _answer(self, worker: _Worker, message: Message) -> None:
        kind, req = message[0], message[1]
        if kind == "watch":
            try:
                reply: object = await self._watch(worker, str(message[2]),
                                                  int(message[3]), str(message[4]))
            except Refused as err:
                reply = err
        elif kind == "catchup":
            reply = self._feed(worker, *self._catch_up(str(message[2]), int(message[3])))
        elif kind == "next":
            reply = self._next(worker, int(message[2]))  # type: ignore[call-overload]
        elif kind == "synced":
            await self.engine.synced.wait()
            reply = True
        else:
            reply = self._unary(str(message[2]), bytes(message[3]), str(message[4]))
        worker.pipe.send(("reply", req, reply))

    def _unary(self, method: str, data: bytes, peer: str) -> bytes | Refused:
        """A unary call's serialised answer, or why it is refused (``peer``'s rate is
        this process's count, so it holds whichever process the peer called)."""
        try:
            request = parse(REQUESTS[method], data)
            if isinstance(request, Malformed):
                return invalid(method, request.message)
            return self._servicer.answer(method, request, peer)
        except Refused as err:
            return err

    async def _watch(self, worker: _Worker, name: str, since: int,
                     peer: str) -> tuple[int, list[bytes], int]:
        """A new stream of ``peer`` on ``worker``: count it against the caps, subscribe
        the worker to the view, say where to start (Refused: refuse it)."""
        await self.engine.synced.wait()
        _, cursor, first = self._servicer.start_stream(name, since, peer)
        worker.peers[peer] += 1
        worker.watching[name] += 1
        return self._feed(worker, cursor, first)

    def _feed(self, worker: _Worker, cursor: int,
              msgs: Iterable[bytes]) -> tuple[int, list[bytes], int]:
        """A stream's first messages for ``worker``: a batch whole, a snapshot one message
        at a time (the worker asks for the next with the id returned, 0 when done)."""
        if isinstance(msgs, list):
            return cursor, msgs, 0
        feed = next(self._feeds)
        worker.feeds[feed] = iter(msgs)
        return cursor, [], feed

    def _next(self, worker: _Worker, feed: int) -> list[bytes]:
        """The next message of a snapshot a worker is writing; [] when it is done."""
        msgs = worker.feeds.get(feed)
        msg = next(msgs, None) if msgs is not None else None
        if msg is None:
            worker.feeds.pop(feed, None)
            return []
        return [msg]

    def _release_slot(self, worker: _Worker, peer: str) -> None:
        if _take_one(worker.peers, peer):
            self._servicer.slots.release(peer)

    def _catch_up(self, name: str, since: int) -> tuple[int, Iterable[bytes]]:
        """A stream whose batches the worker no longer holds (a slow client)."""
        return self.engine.snapshots.catch_up(self.engine.changelog.view(name), since)

    def _unwatch(self, worker: _Worker, name: str) -> None:
        if _take_one(worker.watching, name):
            self._release(name)

    def _release(self, name: str) -> None:
        view = self.engine.changelog.views.get(name)
        if view is not None:
            self.engine.changelog.unwatch(view)

    def _on_publish(self, revision: int, changed: dict[str, list[WireOp]]) -> None:
        for worker in self._workers.values():
            # Each view's batch and the state digest after it.
            ops = {name: (changed[name], self.engine.changelog.views[name].digest)
                   for name in worker.watching if name in changed}
            if ops:
                worker.pipe.send(("publish", revision, ops))


def _take_one(held: Counter[str], key: str) -> bool:
    """Uncount one ``key`` from ``held``; False if none was counted (already released)."""
    if held[key] <= 0:
        return False
    held[key] -= 1
    if not held[key]:
        del held[key]
    return True
