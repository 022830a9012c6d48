"""One agent, two dataplanes: the socket programs for connections made on this node, the
nft backend for packets (traffic from other nodes and outside, SCTP, what no socket hook
sees). Both get every sync; one failing does not keep the other stale."""

from __future__ import annotations

import logging

from svcproxy.sdk import Backend, Changes, NodeState

log = logging.getLogger(__name__)


class Composed(Backend):
    """``primary`` and ``others`` behind one Backend; ``primary`` names it and reports."""

    dataplane = True

    def __init__(self, primary: Backend, *others: Backend) -> None:
        self.primary = primary
        self.backends = (primary, *others)
        self.name = "+".join(b.name for b in self.backends)

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
