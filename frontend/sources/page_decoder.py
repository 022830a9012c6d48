"""Listed pages of EndpointSlices decoded in a second process.

The slices' typed path (typed_slices.py) is most of a listing's Python; this process runs
it on another core and hands the objects back as msgpack, which msgspec decodes into the
very same Structs in C at a fifth of the cost (a page of 500 slices of 10 endpoints: ~5 ms
against ~23 ms), so the frontend's loop only stores them. An item the typed path leaves
to the general path comes back as its JSON, in its place; a page that does not decode as
a list comes back as nothing, and the caller decodes it as before; if the process fails,
the caller decodes every page itself from then on. Services stay with the caller: the
loop, which waits for pages meanwhile, decodes them (a third of the slices' cost) while
this process, the listing's longest path, does the slices.

Frames: to the process's stdin the page's length (4 bytes, big endian) and its JSON; from
its stdout the reply's length and msgpack (empty: not a page).
"""

from __future__ import annotations

import contextlib
import gc
import logging
import subprocess
import sys
import threading
from typing import IO

import msgspec

from svcproxy.frontend.sources.events import Kind
from svcproxy.frontend.sources.kubevalidation import ObjectLimits
from svcproxy.frontend.sources.typed_slices import decode_slice
from svcproxy.frontend.store.objects import EndpointSlice

log = logging.getLogger(__name__)


class _PageMeta(msgspec.Struct):
    resourceVersion: str | None = None
    continue_: str | None = msgspec.field(default=None, name="continue")


class _Page(msgspec.Struct):
    """A list response with its items left as JSON."""

    items: list[msgspec.Raw] | None = None
    metadata: _PageMeta | None = None


class _Slices(msgspec.Struct, array_like=True):
    """A decoded page: continue token, resourceVersion, the typed objects and, by
    position among all the items, those left to the general path."""

    token: str | None
    version: str | None
    objects: list[EndpointSlice]
    others: list[tuple[int, bytes]]


PAGE = msgspec.json.Decoder(_Page)
Page = tuple[list[EndpointSlice | bytes], str | None, str | None]


def decode_page(data: bytes, limits: ObjectLimits) -> bytes:
    """The reply to one page (in the decoding process): msgpack, or b"" when ``data``
    does not decode as a page."""
    try:
        page = PAGE.decode(data)
    except (msgspec.ValidationError, msgspec.DecodeError):
        return b""
    objects, others = [], []
    for i, item in enumerate(page.items or ()):
        obj = decode_slice(item, limits) if memoryview(item)[:1] == b"{" else None
        if obj is None:
            others.append((i, bytes(item)))
        else:
            objects.append(obj)
    meta = page.metadata or _PageMeta()
    return msgspec.msgpack.encode(_Slices(meta.continue_, meta.resourceVersion, objects,
                                          others))


class PageDecoder:
    """The decoding process, shared by the reflector threads (one page at a time)."""

    def __init__(self, limits: ObjectLimits) -> None:
        self._lock = threading.Lock()
        self._decoder = msgspec.msgpack.Decoder(_Slices)
        self._proc: subprocess.Popen[bytes] | None = None
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", __name__, str(limits.max_object_bytes),
                 str(limits.max_depth), str(limits.max_name_length)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        except OSError as err:
            log.warning("cannot start the page decoding process (%s); pages are decoded "
                        "in the frontend's own process", err)

    def decode(self, kind: Kind, data: bytes) -> Page | None:
        """A page's items (typed objects, and the JSON of the others in their places),
        continue token and resourceVersion; None when the caller must decode it (a
        Service's page, too)."""
        if kind != "EndpointSlice":
            return None
        with self._lock:
            proc = self._proc
            if proc is None:
                return None
            try:
                reply = _exchange(proc, len(data).to_bytes(4, "big") + data)
            except (OSError, ValueError) as err:
                log.warning("the page decoding process failed (%s); pages are decoded in "
                            "the frontend's own process from now on", err)
                self._end()
                return None
        if not reply:
            return None
        page = self._decoder.decode(reply)
        items: list[EndpointSlice | bytes] = list(page.objects)
        for i, raw in page.others:
            items.insert(i, raw)
        return items, page.token, page.version

    def close(self) -> None:
        """End the process (it ends by itself when this process does)."""
        with self._lock:
            self._end()

    def _end(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        for pipe in (proc.stdin, proc.stdout):
            if pipe is not None:
                with contextlib.suppress(OSError):  # unflushed bytes to a dead process
                    pipe.close()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _exchange(proc: subprocess.Popen[bytes], frame: bytes) -> bytes:
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(frame)
    proc.stdin.flush()
    return _read_frame(proc.stdout)


def _read_frame(stream: IO[bytes]) -> bytes:
    head = stream.read(4)
    if len(head) != 4:
        raise OSError("the process ended")
    size = int.from_bytes(head, "big")
    data = stream.read(size)
    if len(data) != size:
        raise OSError("the process ended mid-reply")
    return data


def main() -> None:
    """The decoding process: pages in, replies out, until stdin closes. What a page makes
    is dropped once sent and holds no reference cycle: no cyclic collection."""
    gc.disable()
    limits = ObjectLimits(*(int(a) for a in sys.argv[1:4]))
    inp, out = sys.stdin.buffer, sys.stdout.buffer
    while True:
        try:
            data = _read_frame(inp)
        except OSError:
            return
        reply = decode_page(data, limits)
        out.write(len(reply).to_bytes(4, "big") + reply)
        out.flush()


if __name__ == "__main__":
    main()
