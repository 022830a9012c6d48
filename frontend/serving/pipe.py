"""Pickled messages over a ``multiprocessing`` connection, for asyncio on both ends.

Reads happen on the event loop when the pipe is readable; writes go through a
thread of their own, so neither process's loop ever blocks on a full pipe (a
large snapshot one way and many small requests the other way cannot deadlock).
"""

from __future__ import annotations

import asyncio
import logging
import pickle
import queue
import threading
from collections.abc import Callable
from multiprocessing.connection import Connection

log = logging.getLogger(__name__)
Message = tuple[object, ...]


class Pipe:
    """One end: ``send`` from the loop's thread; ``on_message`` runs on the loop."""

    def __init__(self, conn: Connection, on_message: Callable[[Message], None],
                 on_closed: Callable[[], None]) -> None:
        self.conn = conn
        self._on_message = on_message
        self._on_closed = on_closed
        self._out: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._writer = threading.Thread(target=self._write_all, daemon=True,
                                        name="svcproxy-pipe-writer")

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        loop.add_reader(self.conn.fileno(), self._readable)
        self._writer.start()

    def send(self, message: Message) -> None:
        self._out.put(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))

    def close(self) -> None:
        if self._loop is not None and not self.conn.closed:
            self._loop.remove_reader(self.conn.fileno())
        self._out.put(None)

    def _write_all(self) -> None:
        while (data := self._out.get()) is not None:
            try:
                self.conn.send_bytes(data)
            except OSError:
                return

    def _readable(self) -> None:
        try:
            message = pickle.loads(self.conn.recv_bytes())
        except (EOFError, OSError):
            self.close()
            self._on_closed()
            return
        self._on_message(message)
