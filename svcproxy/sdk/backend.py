"""The interface a backend implements: one class, one or two methods."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field

from svcproxy.model import NodeInfo, ServicePortKey, ServicePortState
from svcproxy.sdk.context import NodeContext


@dataclass(frozen=True, slots=True)
class NodeState:
    """A consistent, immutable copy of one node's state at one revision.

    ``context`` is the node context the node agent resolved once for every backend
    (node IPs, NodePort addresses, local-traffic detection); None when the state does
    not come through an agent (a backend then resolves it with ``resolve_context``).
    """

    node_name: str
    revision: int
    node: NodeInfo | None
    services: Mapping[ServicePortKey, ServicePortState] = field(default_factory=dict)
    context: NodeContext | None = None


@dataclass(frozen=True, slots=True)
class Changes:
    """What changed since the previous sync handed to the backend.

    ``full`` asks the backend to rewrite everything it owns from ``state``
    (first sync, after a reset of the stream, after a failed apply, periodic
    resync); ``services`` then lists every service port. ``reason`` says why:
    "initial", "changes", "periodic" or "retry".
    """

    services: frozenset[ServicePortKey] = frozenset()
    node_changed: bool = False
    full: bool = False
    reason: str = "changes"
    # Unix times of the endpoint changes this sync carries (for
    # kubeproxy_network_programming_duration_seconds).
    trigger_times: tuple[float, ...] = ()


class Backend(ABC):
    """A dataplane backend. The node agent calls ``sync`` from one thread.

    Optional attributes the node agent reads (a class attribute or one set in
    ``__init__``; leave them out for the defaults):

    - ``dataplane`` (default True): False for a backend that programs nothing (``dump``):
      the agent then opens no health-check node ports and deletes no conntrack entries
      for it, and ``--init-only`` sets no sysctls.
    - ``proxy_mode`` (a ``ProxyMode``, default None): the kube-proxy mode the backend
      implements, e.g. ``ProxyMode("ipvs", strict_arp=True)``. From it the agent resolves,
      once, the node's IP families, the iptables to invoke and the mode's sysctls (set
      before the first sync), all in ``state.context``.
    - ``refusals`` (a ``svcproxy.sdk.refusals.Refusals``, default None): the service ports
      the dataplane refused while the others were applied. They are logged, and the
      agent counts them (``svcproxy_backend_refused_services``, ``svcproxy_backend_refusals_total``)
      and lists them in ``/healthz`` (``refusedServicePorts``; the node stays healthy).
    - ``node_port_default`` (``"all"`` or ``"primary"``, default ``"all"``): the addresses
      NodePorts answer on without ``--node-port-addresses`` (nft: kube-proxy's nftables
      mode's ``"primary"``), resolved into ``state.context``.
    - ``retry_in()`` (seconds or None): when to sync again to retry refused service
      ports (``StagedBackend`` has it); never sooner than ``--min-sync-period``.
    - ``last_sync_full`` (bool or None), read after each successful sync: whether the
      sync just done was a full one, for kube-proxy's full/partial sync histograms.
    - ``register_metrics(registry)``: called once with the agent's prometheus registry,
      for the backend's own metrics on ``/metrics``.
    - ``health_details`` (a dict): extra keys of ``/healthz`` (e.g. ``ipvsFallback``).
    - ``report_details`` (a mapping of strings) and ``version``: what the node reports
      back to the frontend with each apply (``svcproxy.sdk.report``).
    """

    name: str = "backend"

    @abstractmethod
    def sync(self, state: NodeState, changes: Changes) -> None:
        """Make the dataplane match ``state``. Raise to report failure: the agent
        retries with a full sync; the previous programming must stay intact."""

    def cleanup(self) -> None:  # noqa: B027 - optional hook
        """Remove everything this backend ever programmed (``--cleanup``)."""
