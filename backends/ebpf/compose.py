"""One agent, two dataplanes: the socket programs for connections made on this node, the
nft backend for packets (traffic from other nodes and outside, SCTP, what no socket hook
sees). Both get every sync; one failing does not keep the other stale. The agent sees
the members' refusals as one backend's: their union, each error named by its member, and
the earliest retry."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping

from svcproxy.sdk import Backend, Changes, NodeState, ServicePortKey

log = logging.getLogger(__name__)


class MemberRefusals(Mapping[ServicePortKey, str]):
    """What the agent reads of ``backend.refusals`` (``errors()``, ``total``) over the
    members that keep refusals: service port -> each member's error, named by it."""

    def __init__(self, members: tuple[Backend, ...]) -> None:
        self._members = members

    def _each(self) -> Iterator[tuple[str, object]]:
        for b in self._members:
            refusals = getattr(b, "refusals", None)
            if refusals is not None:
                yield b.name, refusals

    @property
    def total(self) -> int:
        """Refusals recorded so far by all members."""
        return sum(t for _, r in self._each() if isinstance(t := getattr(r, "total", 0), int))

    def errors(self) -> dict[ServicePortKey, str]:
        """Every service port a member refuses, with ``member: error`` (joined by '; '
        when several refuse it)."""
        found: dict[ServicePortKey, str] = {}
        for name, refusals in self._each():
            errors: Callable[[], Mapping[ServicePortKey, str]] | None = getattr(
                refusals, "errors", None)
            for key, error in (errors() if callable(errors) else {}).items():
                said = f"{name}: {error}"
                found[key] = f"{found[key]}; {said}" if key in found else said
        return found

    def __getitem__(self, key: ServicePortKey) -> str:
        return self.errors()[key]

    def __iter__(self) -> Iterator[ServicePortKey]:
        return iter(self.errors())

    def __len__(self) -> int:
        return len(self.errors())


class Composed(Backend):
    """``primary`` and ``others`` behind one Backend; ``primary`` names it and reports."""

    dataplane = True

    def __init__(self, primary: Backend, *others: Backend) -> None:
        self.primary = primary
        self.backends = (primary, *others)
        self.name = "+".join(b.name for b in self.backends)
        self.refusals = MemberRefusals(self.backends)

    @property
    def node_port_default(self) -> str:
        """Where NodePorts answer without --nodeport-addresses, for the agent's one node
        context: what the members declare (the nft packet path: kube-proxy nftables'
        primary node IPs), so each gets the context it gets alone; "all" if none does."""
        declared = {d for b in self.backends if (d := getattr(b, "node_port_default", None))}
        if len(declared) > 1:
            raise ValueError(f"{self.name}: the backends disagree on where NodePorts answer "
                             f"by default ({', '.join(sorted(declared))}); pass "
                             "--nodeport-addresses")
        return declared.pop() if declared else "all"

    @property
    def last_sync_full(self) -> bool | None:
        return getattr(self.primary, "last_sync_full", None)

    def retry_in(self) -> float | None:
        """The earliest of the members' retries of refused service ports (None: none
        waits), so the agent syncs for it as for a single backend."""
        due = [d for b in self.backends
               if callable(retry := getattr(b, "retry_in", None)) and (d := retry()) is not None]
        return min(due, default=None)

    def sync(self, state: NodeState, changes: Changes) -> None:
        self._each("sync", lambda b: b.sync(state, changes))

    def cleanup(self) -> None:
        self._each("cleanup", lambda b: b.cleanup())

    def register_metrics(self, registry: object) -> None:
        for b in self.backends:
            register = getattr(b, "register_metrics", None)
            if callable(register):
                register(registry)

    def _each(self, what: str, call) -> None:  # type: ignore[no-untyped-def]
        """Call every backend; re-raise the first failure after all had their turn."""
        first: Exception | None = None
        for b in self.backends:
            try:
                call(b)
            except Exception as err:  # noqa: BLE001 - re-raised below
                log.error("%s %s failed: %s", b.name, what, err)
                first = first or err
        if first is not None:
            raise first
