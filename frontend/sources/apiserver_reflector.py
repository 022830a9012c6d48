"""List then watch one kind from the apiserver, forever, feeding a sink.

The loop is client-go's reflector: LIST (paged) and emit ``Replace``; WATCH from the
listed resourceVersion with bookmarks, emitting ``Upsert``/``Delete`` and remembering
the resourceVersion of every event; when the stream ends, watch again from there;
on 410 Gone list again (``Replace`` reconciles, so nothing is lost or applied twice);
on any other failure wait with exponential backoff and retry.
"""

from __future__ import annotations

import contextlib
import json
import logging
import random
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import kubernetes.client
import kubernetes.watch
import msgspec
import urllib3.exceptions
from kubernetes.client.exceptions import ApiException

from .apiserver_backoff import Backoff, BackoffPolicy
from .apiserver_resources import Resource, object_ref, resource_version
from .events import RAW_KINDS, Delete, Event, Kind, RawObject, Replace, Sink, Upsert

log = logging.getLogger("svcproxy.frontend.sources.apiserver")

HTTP_GONE = 410


Listed = dict[str, Any] | RawObject


class _PageMeta(msgspec.Struct):
    resourceVersion: str | None = None
    continue_: str | None = msgspec.field(default=None, name="continue")


class _Page(msgspec.Struct):
    """A list response with its items left as JSON (see RawObject)."""

    items: list[msgspec.Raw] | None = None
    metadata: _PageMeta | None = None


_PAGE = msgspec.json.Decoder(_Page)


class _PageStart(msgspec.Struct):
    """A list response's metadata alone (its items skipped)."""

    metadata: _PageMeta | None = None


_PAGE_START = msgspec.json.Decoder(_PageStart)


def _continue_token(data: bytes) -> str | None:
    """A list response's continue token, read ahead of its items (None when unsure)."""
    try:
        meta = _PAGE_START.decode(data).metadata
    except (msgspec.ValidationError, msgspec.DecodeError):
        return None
    return meta.continue_ if meta is not None else None


@dataclass(frozen=True)
class ReflectorOptions:
    """Tuning knobs; the defaults suit a real cluster."""

    page_size: int = 500
    watch_timeout_seconds: int = 300
    connect_timeout: float = 10.0
    list_read_timeout: float = 60.0
    min_healthy_watch: float = 1.0
    backoff: BackoffPolicy = field(default_factory=BackoffPolicy)


class KindReflector:
    """Keeps one kind flowing into the sink; run it on its own thread."""

    def __init__(
        self,
        resource: Resource,
        api: kubernetes.client.ApiClient,
        sink: Sink,
        options: ReflectorOptions,
        on_listed: Callable[[Kind], None],
    ) -> None:
        self.resource = resource
        self.resource_version: str | None = None
        self._list_call = resource.list_call(api)
        self._server = api.configuration.host
        self._sink = sink
        self._options = options
        self._on_listed = on_listed
        self._backoff = Backoff(options.backoff)
        self._stopped = threading.Event()
        self._watch = kubernetes.watch.Watch()
        # When the apiserver stopped answering (None while it answers).
        self.failing_since: float | None = None

    def stop(self) -> None:
        """Ask the loop to end and cut the open watch, if any."""
        self._stopped.set()
        self._watch.stop()

    def run(self) -> None:
        """List and watch until stopped."""
        while not self._stopped.is_set():
            listing = self.resource_version is None
            try:
                if listing:
                    self._list()
                    continue
                if self._watch_once():
                    self._backoff.reset()
                    continue
                failure = "the apiserver closed the watch immediately"
            except ApiException as exc:
                if exc.status == HTTP_GONE:
                    self._gone(listing, exc)
                    continue
                failure = self._describe_api_error(exc)
            except Exception as exc:  # any other failure: back off and retry
                failure = _describe_error(exc)
                if not isinstance(exc, urllib3.exceptions.HTTPError | OSError):
                    log.exception("unexpected failure while watching %s", self.resource.plural)
                    self.resource_version = None
            if self._stopped.is_set():
                return
            self._retry_later("list" if listing else "watch", failure)

    def _list(self) -> None:
        """List every object, page by page, each page emitted as a part of one Replace
        as soon as it is read (the engine parses it while the next page is fetched). The
        next page is asked for while this thread reads one (its continue token taken
        first), so the apiserver and the decoding work at once."""
        pages = items = 0
        with ThreadPoolExecutor(1, thread_name_prefix=f"list-{self.resource.plural}") as ahead:
            data = self._get_page(None)
            while True:
                hint = _continue_token(data)
                fetched = ahead.submit(self._get_page, hint) if hint else None
                objs, token, version = self._read_page(data)
                token = token or None
                self._emit(Replace(self.resource.kind, objs, first=pages == 0,
                                   last=token is None))
                pages += 1
                items += len(objs)
                if token is None:
                    break
                # The page asked for ahead, unless this page's token read otherwise.
                data = (fetched.result() if fetched is not None and token == hint
                        else self._get_page(token))
        self.resource_version = str(version or "")
        self._backoff.reset()
        self.failing_since = None
        log.info(
            "listed %d %s from %s at resourceVersion %s (%d page%s)",
            items, self.resource.plural, self._server, self.resource_version,
            pages, "" if pages == 1 else "s",
        )
        self._on_listed(self.resource.kind)

    def _get_page(self, token: str | None) -> bytes:
        """One list request's response body."""
        opts = self._options
        resp = self._list_call(
            limit=opts.page_size,
            _continue=token,
            _preload_content=False,
            _request_timeout=(opts.connect_timeout, opts.list_read_timeout),
        )
        try:
            return bytes(resp.data)
        finally:
            resp.release_conn()

    def _read_page(self, data: bytes) -> tuple[list[Listed], Any, Any]:
        """A list response's items (dicts; objects of RAW_KINDS as RawObject, for the
        store to decode), continue token and resourceVersion."""
        if self.resource.kind in RAW_KINDS:
            try:
                page = _PAGE.decode(data)
            except (msgspec.ValidationError, msgspec.DecodeError):
                pass  # the general path says what is wrong with it
            else:
                meta = page.metadata or _PageMeta()
                kind, version = self.resource.kind, self.resource.api_version
                return ([RawObject(kind, version, item) if memoryview(item)[:1] == b"{"
                         else self.resource.complete(json.loads(bytes(item)))
                         for item in page.items or []], meta.continue_, meta.resourceVersion)
        body = json.loads(data)
        listed = body.get("metadata") or {}
        return ([self.resource.complete(item) for item in body.get("items") or []],
                listed.get("continue"), listed.get("resourceVersion"))

    def _watch_once(self) -> bool:
        """Stream one watch to its end; True if it was healthy (not an instant close)."""
        opts = self._options
        timeout = random.randint(opts.watch_timeout_seconds, 2 * opts.watch_timeout_seconds)
        started = time.monotonic()
        events = 0
        stream = self._watch.stream(
            self._raw_call,
            resource_version=self.resource_version,
            allow_watch_bookmarks=True,
            timeout_seconds=timeout,
            _request_timeout=(opts.connect_timeout, timeout + 30),
        )
        with contextlib.closing(stream):
            for event in stream:
                if self._stopped.is_set():
                    break
                if isinstance(event, dict):
                    self._apply(event["type"], event["raw_object"])
                    events += 1
                    self.failing_since = None
        return events > 0 or time.monotonic() - started >= opts.min_healthy_watch

    def _raw_call(self, **kwargs: Any) -> Any:
        """The list call, wrapped so that Watch hands us raw dicts instead of models."""
        return self._list_call(**kwargs)

    def _apply(self, type_: str, obj: dict[str, Any]) -> None:
        """Turn one watch event into a sink event and remember its resourceVersion."""
        if type_ in ("ADDED", "MODIFIED"):
            self._emit(Upsert(self.resource.kind, self.resource.complete(obj)))
        elif type_ == "DELETED":
            self._emit(Delete(self.resource.kind, *object_ref(obj)))
        rv = resource_version(obj)
        if rv is not None:
            self.resource_version = rv

    def _emit(self, event: Event) -> None:
        self._sink([event])

    def _gone(self, listing: bool, exc: ApiException) -> None:
        """410 Gone: our resourceVersion is too old (or a continue token expired): relist."""
        what = "list" if listing else "watch"
        log.warning(
            "%s of %s from resourceVersion %s expired (410 Gone: %s); listing again "
            "(normal after a long disconnect or an apiserver restart)",
            what, self.resource.plural, self.resource_version, exc.reason,
        )
        self.resource_version = None
        if listing:
            self._retry_later("list", "continue token expired")

    def _retry_later(self, what: str, failure: str) -> None:
        if self.failing_since is None:
            self.failing_since = time.monotonic()
        delay = self._backoff.next_delay()
        log.warning(
            "apiserver %s: cannot %s %s: %s; retrying in %.1fs",
            self._server, what, self.resource.plural, failure, delay,
        )
        self._stopped.wait(delay)

    def _describe_api_error(self, exc: ApiException) -> str:
        """An HTTP error from the apiserver, with what to do about it."""
        if exc.status == 401:
            return (
                "401 Unauthorized: the apiserver rejected the credentials "
                "(check the user in --kubeconfig or the pod's ServiceAccount token)"
            )
        if exc.status == 403:
            return (
                f"403 Forbidden: grant the frontend's account list and watch on "
                f"{self.resource.plural} (see the ClusterRole in deploy/)"
            )
        if exc.status == 0:
            return str(exc.reason)
        return f"HTTP {exc.status} {exc.reason}"


def _describe_error(exc: Exception) -> str:
    """A one-line reason for a connection-level failure."""
    if isinstance(exc, urllib3.exceptions.MaxRetryError):
        return (
            f"{exc.reason} (is the apiserver address in --kubeconfig reachable "
            f"from here?)"
        )
    if isinstance(exc, urllib3.exceptions.ReadTimeoutError):
        return "the apiserver stopped answering (read timeout)"
    if isinstance(exc, urllib3.exceptions.ProtocolError):
        return f"connection broken ({exc.args[0] if exc.args else exc})"
    return f"{type(exc).__name__}: {exc}"
