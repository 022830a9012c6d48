"""The stages both ebpf backends share (the socket programs' and the tc programs'): the
SDK's render -> diff -> apply over one pair of services and endpoints maps.

``render`` is a service port's entries (the subclass's ``entries``, pure), screened by
the SDK (``self.refusals``: a record with a value no entry may hold is refused before
it is rendered; one with more endpoints than an entry counts, by ``render``); ``apply``
is ``MapApply``'s stage and write; ``find_drift`` reads both maps back.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Hashable

from svcproxy.sdk import (
    Changes,
    Delta,
    Drift,
    NodeConfig,
    NodeState,
    Refusals,
    ServicePortKey,
    ServicePortState,
    StagedBackend,
    resolve_context,
)

from .apply import MapApply
from .drift import MapDrift
from .layout import ServiceAddress
from .render import Entry, ServicePortEntries, TooManyEndpoints


def node_port_ips(config: NodeConfig, state: NodeState) -> tuple[str, ...]:
    """Where NodePorts answer, named: the node context's ``node_port_ips_listed``
    (never loopback; for a family the CIDRs leave open, the node IPs and every other
    address on the node's interfaces, as IPVS names them)."""
    node = state.context or resolve_context(config, state.node)
    return tuple(ip for fam in node.families for ip in fam.node_port_ips_listed)


class MapsBackend(StagedBackend[ServicePortEntries]):
    """A StagedBackend whose value per service port is its map entries."""

    def __init__(self, config: NodeConfig) -> None:
        super().__init__()
        self.config = config
        self.refusals = Refusals(self.name)
        self.maps: MapApply | None = None  # made by ``start``
        self.node_ips: tuple[str, ...] | None = None  # the applied entries' NodePort IPs
        self.rendered_for: Hashable = None  # the context the applied entries assumed
        self.last_drift: MapDrift | None = None  # what the last periodic resync found
        self.drift_repairs = 0

    @abstractmethod
    def entries(self, record: ServicePortState) -> dict[ServiceAddress, Entry]:
        """The service port's entries (pure; TooManyEndpoints when they do not fit)."""

    def context(self, state: NodeState) -> Hashable:
        """What every entry depends on besides its record (the NodePort IPs; sets
        ``self.node_ips``): when it changes, everything is rendered and rebuilt."""
        self.node_ips = node_port_ips(self.config, state)
        return self.node_ips

    def diff(self, state: NodeState, changes: Changes
             ) -> Delta[ServicePortKey, ServicePortEntries]:
        """The SDK's diff, everything rendered again for a new context."""
        context = self.context(state)
        if context != self.rendered_for:
            self.applied.invalidate()
            self.rendered_for = context
        return super().diff(state, changes)

    def render(self, state: NodeState, record: ServicePortState) -> ServicePortEntries | None:
        """The service port's entries; None: it has none. One the maps cannot hold is
        refused until it changes (its applied entries stay)."""
        key = record.key
        try:
            entries = tuple(self.entries(record).items())
        except TooManyEndpoints as err:
            self.refusals.refuse(key, record, str(err), retry=False)
            return self.applied.get(key)
        if key in self.refusals:
            self.refusals.clear(key)
        return entries or None

    def find_drift(self, state: NodeState) -> Drift[ServicePortKey]:
        """Both maps read back and compared with what this process wrote."""
        if self.maps is None:
            return Drift()
        found = self.maps.find_drift()
        self.last_drift = self.maps.drift
        if self.last_drift:
            self.drift_repairs += 1
        return found

    def forget(self) -> None:
        """The maps are another process's now (a new load): read them at the next sync."""
        self.applied.invalidate()
        self.rendered_for = None
