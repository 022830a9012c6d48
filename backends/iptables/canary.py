"""Did someone flush our rules? kube-proxy's canary: an empty chain we own in mangle.

A full sync declares KUBE-PROXY-CANARY in mangle, nat and filter. Firewall
reloads (``iptables -F``/``-X``, firewalld, a restore without --noflush)
remove it; before each sync the backend probes mangle's and, when it is gone,
rewrites everything. In legacy mode with no command prefix the probe uses
python-iptables (libiptc, in process: ~0.05 ms); otherwise it runs ``iptables -S``
(a process: a few ms).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from svcproxy.backends.iptables import names
from svcproxy.backends.iptables.apply import Iptables, IptablesError

log = logging.getLogger(__name__)

Probe = Callable[[], bool]
CANARY_TABLES = ("mangle", "nat", "filter")


def make_probe(tool: Iptables) -> Probe:
    """A function telling whether the mangle canary chain of ``tool``'s family exists."""

    def with_iptables() -> bool:
        return tool.chain_exists("mangle", names.CANARY)

    if tool.mode != "legacy" or tool.prefix:
        return with_iptables
    chosen: list[Probe] = []

    def probe() -> bool:
        if not chosen:  # importing python-iptables takes ~0.5 s: only when first needed
            chosen.append(_iptc_probe(tool.family) or with_iptables)
        return chosen[0]()

    return probe


def _iptc_probe(family: int) -> Probe | None:
    try:
        import iptc
    except (ImportError, OSError) as err:  # the C library may be missing
        log.info("python-iptables unavailable (%s); probing canaries with iptables -S", err)
        return None
    table_class = iptc.Table if family == 4 else iptc.Table6

    def present() -> bool:
        try:
            table = table_class(table_class.MANGLE)
            table.refresh()
            return bool(table.is_chain(names.CANARY))
        except iptc.IPTCError as err:
            raise IptablesError(f"python-iptables could not read mangle: {err}") from err

    return present
