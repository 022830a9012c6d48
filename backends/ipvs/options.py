"""The IPVS backend's own settings (kube-proxy's --ipvs-* flags) and their checks."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from svcproxy.backends.ipvs import names as N

SCHEDULERS = ("rr", "wrr", "lc", "wlc", "lblc", "lblcr", "sh", "dh", "sed", "nq", "mh")


class OptionError(ValueError):
    """A setting that cannot work; the message says which and why."""


@dataclass(frozen=True, slots=True)
class IpvsOptions:
    scheduler: str = "rr"
    exclude_cidrs: tuple[str, ...] = ()
    strict_arp: bool = False
    tcp_timeout: int = 0
    tcpfin_timeout: int = 0
    udp_timeout: int = 0
    # A removed real server is deleted once drained, or at the latest after this.
    graceful_termination_timeout: float = 600.0
    # How often draining real servers are checked.
    graceful_check_interval: float = 2.0
    interface: str = N.DUMMY_INTERFACE

    def __post_init__(self) -> None:
        check_scheduler(self.scheduler, "--ipvs-scheduler")

    def excluded(self, address: str) -> bool:
        """True for an IPVS address inside --ipvs-exclude-cidrs (never touched)."""
        ip = ipaddress.ip_address(address)
        return any(ip in ipaddress.ip_network(c) for c in self.exclude_cidrs)


def check_scheduler(name: str, where: str) -> str:
    """``name`` if IPVS knows that scheduler, else an OptionError naming the choices."""
    if name not in SCHEDULERS:
        raise OptionError(
            f"{where}: unknown IPVS scheduler {name!r}; choose one of {', '.join(SCHEDULERS)}"
        )
    return name
