"""Which service port's entry each address gets (pure).

Two service ports may render one address, port and protocol (an externalIP equal to
another service's ClusterIP, say): the lowest key serves it, the conflict is logged,
and when that one leaves the next takes over.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping

from svcproxy.sdk import ServicePortKey

from .layout import ServiceAddress
from .render import Entry, ServicePortEntries

log = logging.getLogger(__name__)


class AddressClaims:
    """The addresses' entries, from each service port's rendered entries."""

    def __init__(self) -> None:
        self.by_service: dict[ServicePortKey, dict[ServiceAddress, Entry]] = {}
        self.claimants: dict[ServiceAddress, set[ServicePortKey]] = {}
        self.entries: dict[ServiceAddress, Entry] = {}

    @classmethod
    def of(cls, values: Mapping[ServicePortKey, ServicePortEntries]) -> AddressClaims:
        """The claims of every service port in ``values``."""
        claims = cls()
        claims.update(values.items())
        return claims

    def update(self, values: Iterable[tuple[ServicePortKey, ServicePortEntries | None]]
               ) -> set[ServiceAddress]:
        """Set each service port's entries (None: it is gone); returns the addresses
        whose entry may have changed."""
        touched: set[ServiceAddress] = set()
        for key, value in values:
            for address in self.by_service.pop(key, {}):
                touched.add(address)
                self.claimants[address].discard(key)
            if not value:
                continue
            entries = self.by_service[key] = dict(value)
            for address in entries:
                touched.add(address)
                self.claimants.setdefault(address, set()).add(key)
        for address in touched:
            self._settle(address)
        return touched

    def owner(self, address: ServiceAddress) -> ServicePortKey | None:
        """The service port whose entry the address holds."""
        claimants = self.claimants.get(address)
        return min(claimants) if claimants else None

    def _settle(self, address: ServiceAddress) -> None:
        claimants = self.claimants.get(address)
        if not claimants:
            self.claimants.pop(address, None)
            self.entries.pop(address, None)
            return
        winner = min(claimants)
        if len(claimants) > 1:
            log.warning("%s is claimed by %s; %s serves it", address,
                        ", ".join(map(str, sorted(claimants))), winner)
        self.entries[address] = self.by_service[winner][address]
