"""The one table other backends touch: how to run each backend in the lab.

Add a row to run the whole scenario suite against another backend.
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class BackendCase:
    """A backend under test: its ``svcproxy backend`` name and extra flags."""

    name: str
    extra_args: tuple[str, ...] = ()

    def __str__(self) -> str:
        return self.name


BACKENDS: tuple[BackendCase, ...] = (
    BackendCase("nft"),
    BackendCase("iptables"),
)
if os.environ.get("SVCPROXY_IPVS_GUEST") == "1":
    BACKENDS += (BackendCase("ipvs"),)
