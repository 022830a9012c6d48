"""The iptables backend run in place of IPVS when the kernel has none, saying so.

kube-proxy's seeds describe the fallback; an operator must see it: the reason is logged
once, exported as ``svcproxy_ipvs_fallback{reason} 1`` and shown in /healthz as
``ipvsFallback``. ``--ipvs-no-fallback`` exits with the reason instead (as kube-proxy
does when the chosen mode cannot run).
"""

from __future__ import annotations

from typing import Any

from svcproxy.sdk import Backend, Changes, NodeState


class IptablesFallback(Backend):
    """Delegates everything to ``inner`` (the iptables backend) and reports why."""

    def __init__(self, inner: Backend, reason: str) -> None:
        self._inner = inner
        self.reason = reason
        self.name = inner.name
        self.health_details = {"ipvsFallback": {"runningMode": inner.name, "reason": reason}}

    def sync(self, state: NodeState, changes: Changes) -> None:
        self._inner.sync(state, changes)

    def cleanup(self) -> None:
        self._inner.cleanup()

    def register_metrics(self, registry: Any) -> None:
        from prometheus_client import Gauge

        register = getattr(self._inner, "register_metrics", None)
        if callable(register):
            register(registry)
        Gauge("svcproxy_ipvs_fallback",
              "1 when the ipvs backend runs the iptables backend instead (the kernel has no "
              "IPVS); reason says why", ["reason"], registry=registry).labels(
                  reason=self.reason).set(1)

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._inner, attr)
