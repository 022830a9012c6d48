"""What one client may cost the frontend: caps on concurrent streams and the write timeout.

A Watch stream costs one message in flight (gRPC flow control holds the rest back, see
stream.py); these limits bound how many streams there are and how long one may sit on
a message its client does not read:

- ``StreamSlots`` counts streams, in total and per peer address, from the call's start
  until gRPC has finished it (a stream ended for not reading holds its last message
  until its connection is closed, see below, and keeps its slot until then).
  Beyond a cap a new stream is refused with RESOURCE_EXHAUSTED.
- ``StallWatch`` ends a stream whose write has not completed for ``write_timeout``
  seconds with UNAVAILABLE: the client is told to resume from its revision. gRPC
  cannot send that status past the message the client does not read, so
  HANG_UP_GRACE seconds later the stream's connection is closed (hangup.py): the
  client sees UNAVAILABLE at once and the call, and so its slot, is finished.
- ``AnswerBudget`` bounds the bytes of unary answers (a GetNodeState page is up to
  3 MiB) that gRPC holds until their clients read them, per peer and in all; beyond it a
  call is refused with RESOURCE_EXHAUSTED.
- ``UnaryRates`` limits unary calls per peer address to a rate with a burst (a token
  bucket, a costly call counting as several); beyond it a call is refused with
  RESOURCE_EXHAUSTED before any work, the refusal held back (``RefusalDelay``) until the
  call could have been answered.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import grpc

from svcproxy.frontend.admission.refusals import Refused
from svcproxy.frontend.runtime.metrics import counter
from svcproxy.frontend.serving.hangup import Remote, close_connections, remote_of

log = logging.getLogger(__name__)

REFUSED = counter("svcproxy_frontend_watch_refused_total",
                  "Watch and WatchCluster streams refused because a cap was reached, "
                  "by cap (total, peer).", ["cap"])
STALLED = counter("svcproxy_frontend_watch_stalled_total",
                  "Watch streams ended because their client read nothing for "
                  "--stream-write-timeout seconds, stream workers' included.")
HUNG_UP = counter("svcproxy_frontend_watch_connections_closed_total",
                  "Connections (TCP, or unix socket) closed because a Watch stream on them "
                  "was ended for "
                  "reading nothing (--stream-write-timeout; gRPC cannot end one stream its "
                  "client does not read), stream workers' included.")
FAILED = counter("svcproxy_frontend_watch_failed_total",
                 "Watch and WatchCluster streams that ended on an error of the frontend's "
                 "own (each logged with the node it served), stream workers' included.")
UNARY_REFUSED = counter("svcproxy_frontend_unary_refused_total",
                        "GetNodeState and ListNodes calls refused because the answers "
                        "their client address (peer) or every client (total) has not read "
                        "yet reached their budget (total, peer), or because their client "
                        "address called more often than --unary-qps-per-peer allows "
                        "(rate), by cap.", ["cap"])


@dataclass(frozen=True, slots=True)
class StreamLimits:
    """The flags: --max-streams, --max-streams-per-peer, --stream-write-timeout,
    --unary-qps-per-peer, --unary-burst-per-peer; and the bytes of unary answers not
    read yet, per client address and in all (per process)."""

    max_streams: int = 10000
    max_streams_per_peer: int = 100
    write_timeout: float = 60.0
    answer_bytes_per_peer: int = 32 << 20
    answer_bytes_total: int = 256 << 20
    # Off unless given (tests poll GetNodeState); the command line's default is on.
    unary_qps_per_peer: float = 0.0
    unary_burst_per_peer: int = 20


def peer_address(peer: str) -> str:
    """The address part of ``context.peer()``: "ipv4:10.0.0.1:4242" -> "10.0.0.1",
    "ipv6:[fd00::1]:4242" -> "fd00::1"; every unix socket client is "unix"."""
    kind, _, rest = peer.partition(":")
    if kind in ("ipv4", "ipv6"):
        return rest.rpartition(":")[0].strip("[]")
    return kind or peer


class StreamSlots:
    """Concurrent streams, in total and per peer address, under their caps."""

    def __init__(self, limits: StreamLimits) -> None:
        self.limits = limits
        self.total = 0
        self.per_peer: Counter[str] = Counter()

    def acquire(self, peer: str) -> None:
        """Count one more stream of ``peer`` (an address); Refused beyond a cap."""
        limits = self.limits
        if self.total >= limits.max_streams:
            REFUSED.labels("total").inc()
            raise Refused("RESOURCE_EXHAUSTED", (
                f"this frontend serves its maximum of {limits.max_streams} streams "
                "(--max-streams); retry later with backoff, or connect to another replica"))
        if self.per_peer[peer] >= limits.max_streams_per_peer:
            REFUSED.labels("peer").inc()
            who = "the unix socket's clients have" if peer == "unix" else f"{peer} has"
            raise Refused("RESOURCE_EXHAUSTED", (
                f"{who} already {self.per_peer[peer]} open streams, the maximum per "
                "client address (--max-streams-per-peer; every unix socket client is one "
                "address); close streams you no longer read, or retry later with backoff"))
        self.total += 1
        self.per_peer[peer] += 1

    def release(self, peer: str) -> None:
        self.total -= 1
        self.per_peer[peer] -= 1
        if self.per_peer[peer] <= 0:
            del self.per_peer[peer]


class AnswerBudget:
    """Bytes of unary answers gRPC holds until their clients have read them, per peer
    address and in all. A peer holding nothing is always answered (one page); one that
    could not take another answer of ``largest`` bytes is refused before any is made."""

    def __init__(self, per_peer: int, total: int, largest: int) -> None:
        self.limits = per_peer, total
        self.largest = largest
        self.total = 0
        self.per_peer: Counter[str] = Counter()

    def admit(self, peer: str) -> None:
        """Refused when an answer as large as any could exceed a budget of ``peer``."""
        self._check(peer, self.largest)

    def hold(self, context: grpc.aio.ServicerContext, peer: str, answer: bytes) -> bytes:
        """``answer``, counted until gRPC has finished the call; Refused beyond a budget."""
        size = len(answer)
        self._check(peer, size)
        self.total += size
        self.per_peer[peer] += size
        context.add_done_callback(lambda _: self._release(peer, size))
        return answer

    def _check(self, peer: str, size: int) -> None:
        per_peer, total = self.limits
        held = self.per_peer[peer]
        if held and held + size > per_peer:
            UNARY_REFUSED.labels("peer").inc()
            raise Refused("RESOURCE_EXHAUSTED", (
                f"{peer} has not read {held} bytes of earlier answers, the most one client "
                "address may leave unread: read the answers you asked for (one call at a "
                "time is enough), or retry later with backoff"))
        if self.total and self.total + size > total:
            UNARY_REFUSED.labels("total").inc()
            raise Refused("RESOURCE_EXHAUSTED", (
                f"clients have not read {self.total} bytes of answers, the most this "
                "frontend holds for them: retry later with backoff, or ask another replica"))

    def _release(self, peer: str, size: int) -> None:
        self.total -= size
        self.per_peer[peer] -= size
        if self.per_peer[peer] <= 0:
            del self.per_peer[peer]


class PeerLog:
    """Warnings about one client address, at most one per ``interval`` seconds per
    address (the next says how many were left out); memory follows the addresses
    logged in the last interval."""

    def __init__(self, interval: float = 60.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.interval = interval
        self.clock = clock
        self.seen: dict[str, list[float]] = {}  # peer -> [when logged, left out since]
        self._swept = clock()

    def warn(self, peer: str, message: str, *args: object) -> None:
        now = self.clock()
        seen = self.seen.get(peer)
        if now - self._swept >= self.interval:
            self._swept = now
            self.seen = {p: s for p, s in self.seen.items() if now - s[0] < self.interval}
        if seen is not None and now - seen[0] < self.interval:
            seen[1] += 1
            return
        log.warning(message + "; logged once per %.0f s per client address%s", *args,
                    self.interval, f" ({seen[1]:.0f} more since the last line)"
                    if seen is not None and seen[1] else "")
        self.seen[peer] = [now, 0.0]


# A unary call counts as one more call per this much CPU its answer took on the loop
# beyond the first (a cached page of a 10,000-service node takes ~20 ms, a new listing
# 80-180 ms, a node's first view ~2 s), as kube-apiserver's priority and fairness
# counts a LIST as more seats the more objects it returns.
CALL_SECONDS = 0.025


class UnaryRates:
    """GetNodeState and ListNodes calls per peer address, as kube's client-side
    --kube-api-qps/--kube-api-burst limit theirs: a token bucket of ``burst`` calls
    refilled at ``qps`` per second, a call that took more than CALL_SECONDS of the loop
    counting as more (``charge``); ``qps`` 0 is no limit. A peer whose bucket is full
    again is forgotten (every minute), so memory follows the active peers."""

    def __init__(self, qps: float, burst: int,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.qps = qps
        self.burst = max(1, burst)
        self.clock = clock
        self.buckets: dict[str, tuple[float, float]] = {}  # peer -> (tokens, when)
        self.log = PeerLog(clock=clock)
        self._swept = clock()

    def admit(self, peer: str) -> None:
        """Take one call of ``peer``'s; Refused (RESOURCE_EXHAUSTED) beyond the rate."""
        if self.qps <= 0:
            return
        now = self.clock()
        if now - self._swept >= 60.0:
            self._sweep(now)
        tokens, when = self.buckets.get(peer, (self.burst, now))
        tokens = min(float(self.burst), tokens + (now - when) * self.qps)
        if tokens >= 1.0:
            self.buckets[peer] = (tokens - 1.0, now)
            return
        self.buckets[peer] = (tokens, now)
        UNARY_REFUSED.labels("rate").inc()
        self.log.warn(peer, "refusing unary calls from %s beyond %g per second (burst %d; "
                      "--unary-qps-per-peer, --unary-burst-per-peer)", peer, self.qps,
                      self.burst)
        who = "the unix socket's clients" if peer == "unix" else peer
        wait = (1.0 - tokens) / self.qps
        raise Refused("RESOURCE_EXHAUSTED", (
            f"{who} called more than {self.qps:g} times per second, the most one client "
            f"address may on average ({self.burst} at once; --unary-qps-per-peer, "
            f"--unary-burst-per-peer): retry in {wait:.2f} s or later with backoff, and "
            "Watch the node instead of polling GetNodeState"),
            delay=min(wait, MAX_REFUSAL_DELAY))

    def charge(self, peer: str, seconds: float) -> None:
        """Count the call ``peer`` was admitted for, which took ``seconds`` of CPU, as
        one more call per CALL_SECONDS beyond the first (its bucket may go below zero:
        its next calls wait the longer)."""
        extra = int(seconds / CALL_SECONDS)
        if self.qps > 0 and extra and peer in self.buckets:
            tokens, when = self.buckets[peer]
            self.buckets[peer] = (tokens - extra, when)

    def _sweep(self, now: float) -> None:
        self._swept = now
        for peer, (tokens, when) in list(self.buckets.items()):
            if tokens + (now - when) * self.qps >= self.burst:
                del self.buckets[peer]


# A refusal for the rate is sent when the call could have been answered, at most this
# many seconds later, and for at most HELD_REFUSALS calls per peer at once (per
# process; the others at once): a client that retries at once is slowed to the rate
# instead of costing the frontend gRPC's work per call (~1.5 ms of CPU) as fast as it
# can loop, as kube-apiserver's priority and fairness queues requests before a 429.
MAX_REFUSAL_DELAY = 1.0
HELD_REFUSALS = 8


class RefusalDelay:
    """Holds back refusals that carry a delay, a few per peer at once."""

    def __init__(self, most: int = HELD_REFUSALS) -> None:
        self.most = most
        self.held: Counter[str] = Counter()

    async def hold(self, peer: str, refusal: Refused) -> None:
        if refusal.delay <= 0 or self.held[peer] >= self.most:
            return
        self.held[peer] += 1
        try:
            await asyncio.sleep(refusal.delay)
        finally:
            self.held[peer] -= 1
            if self.held[peer] <= 0:
                del self.held[peer]


# Seconds between a stream's end for not reading (its status set, for a client that
# reads again meanwhile) and the close of its TCP connection.
HANG_UP_GRACE = 1.0


class WriteClock:
    """One stream's write in progress: when it started (0.0: none), read by StallWatch;
    ``now`` is the loop's clock (found once: on Python 3.11 every lookup of the running
    loop is a getpid system call); ``remote`` its client's TCP end (None: unix socket)."""

    __slots__ = ("task", "now", "started", "stalled", "remote")

    def __init__(self, task: asyncio.Task[object] | None,
                 now: Callable[[], float], remote: Remote | None = None) -> None:
        self.task = task
        self.now = now
        self.started = 0.0
        self.stalled = False
        self.remote = remote


class StallWatch:
    """Ends the streams whose current write has waited ``timeout`` seconds or more.

    A stream marks the start and end of each write on its ``WriteClock`` (two attribute
    stores, nothing per write on the loop); one task looks at every clock a few times
    per timeout, cancels the handler of a stream found stalled and, ``grace`` seconds
    later, closes its TCP connection (see hangup.py for why).
    """

    def __init__(self, timeout: float, grace: float = HANG_UP_GRACE) -> None:
        self.timeout = timeout
        self.grace = grace
        self.clocks: set[WriteClock] = set()
        self._task: asyncio.Task[None] | None = None
        self._hangups: set[asyncio.Future[None]] = set()

    def register(self, peer: str = "") -> WriteClock:
        """A clock for the stream of ``peer`` (``context.peer()``) running in the
        current task."""
        clock = WriteClock(asyncio.current_task(), asyncio.get_running_loop().time,
                           remote_of(peer))
        if self.timeout > 0:
            self.clocks.add(clock)
            if self._task is None or self._task.done():
                self._task = asyncio.ensure_future(self._sweep())
        return clock

    def unregister(self, clock: WriteClock) -> None:
        self.clocks.discard(clock)

    def stalled(self, now: float) -> list[WriteClock]:
        """The clocks whose write started ``timeout`` seconds or more before ``now``."""
        limit = now - self.timeout
        return [c for c in self.clocks if c.started and c.started <= limit and not c.stalled]

    async def _sweep(self) -> None:
        loop = asyncio.get_running_loop()
        period = max(0.05, self.timeout / 4)
        while self.clocks:
            await asyncio.sleep(period)
            remotes = set()
            for clock in self.stalled(loop.time()):
                clock.stalled = True
                if clock.task is not None:
                    clock.task.cancel()
                if clock.remote is not None:
                    remotes.add(clock.remote)
            if remotes:
                hangup = asyncio.ensure_future(self._hang_up(remotes))
                self._hangups.add(hangup)
                hangup.add_done_callback(self._hangups.discard)

    async def _hang_up(self, remotes: set[Remote]) -> None:
        """Close the connections of ``remotes`` after the grace (off the loop: it looks
        at every descriptor of the process)."""
        await asyncio.sleep(self.grace)
        closed = await asyncio.get_running_loop().run_in_executor(
            None, close_connections, remotes)
        HUNG_UP.inc(closed)
        log.warning("closed %d connection(s) of %d client(s) whose streams were ended "
                    "for reading nothing (--stream-write-timeout): gRPC cannot end one "
                    "stream its client does not read (nor tell unix socket clients apart: "
                    "all of those are closed); they reconnect and resume", closed,
                    len(remotes))


def stalled_status(context: grpc.aio.ServicerContext, timeout: float, what: str) -> None:
    """Finish a stream ended by StallWatch with UNAVAILABLE telling its client to resume."""
    log.warning("watch from %s for %s ended: nothing read for %.0f s (--stream-write-"
                "timeout)", context.peer(), what, timeout)
    context.set_code(grpc.StatusCode.UNAVAILABLE)
    context.set_details(
        f"the frontend ended this stream: the client read nothing for {timeout:g} s "
        "(--stream-write-timeout); reconnect and resume with since_revision set to the "
        "last revision applied")
