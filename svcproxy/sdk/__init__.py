"""The SDK for backend authors: the one import a backend needs.

A backend is one class::

    from svcproxy.sdk import Backend, Changes, NodeState

    class MyBackend(Backend):
        def sync(self, state: NodeState, changes: Changes) -> None:
            for key in changes.services:
                record = state.services.get(key)   # None: deleted
                ...

What it holds (every name below is in ``__all__``; see docs/writing-a-backend.md):

* the interface: ``Backend``, ``NodeState``, ``Changes``; ``StagedBackend``, ``Applied``
  and ``Delta`` for render -> diff -> apply with the applied state tracked for you, and
  ``Drift`` for what its ``find_drift`` finds changed behind its back;
* the state's types: ``ServicePortKey``, ``ServicePort``, ``ServicePortState``,
  ``Endpoint``, ``NodeInfo``, the enums, and helpers on addresses;
* the node context: ``NodeConfig`` (kube-proxy's node flags), ``resolve_context`` ->
  ``NodeContext`` (node IPs, NodePort addresses, local-traffic detection per family; the
  IP families, the iptables to invoke and the sysctls of the ``ProxyMode`` a backend
  declares, which the agent sets);
* the client: ``NodeStateClient`` (watch one node's state), ``tls_credentials``,
  ``WatchRefused`` (the frontend refused the request itself: fix it, do not retry);
* running: ``run.run`` (the smallest loop), ``run_agent`` and ``add_agent_arguments`` (the
  node agent: rate limiting, retries, /healthz, /metrics, health-check node ports),
  ``BackendPlugin``, ``ENTRY_POINT_GROUP`` and ``installed_backends`` (how ``svcproxy
  backend NAME`` finds it);
* refusals: ``Refusals`` (service ports the dataplane refused, retried with backoff),
  ``invalid_values`` (values no rule may hold), ``isolate`` / ``isolate_versions`` /
  ``TooManyRefused`` (find what a batch's failure refuses), ``describe_service_port``;
* kernel helpers: ``netlink`` (messages and attributes as bytes, a socket in any network
  namespace, ``NftablesReader`` for nftables' dumps and generation) and ``rtnetlink``
  (addresses, default routes, interface indexes), as modules;
* the node agent itself (``agent``, ``node_agent``, ``runner``, ``healthz``, ``metrics``,
  ``service_health``, ``conntrack_*``): the modules ``run_agent`` runs, inside the SDK so
  that it imports nothing above it;
* ``svcproxy.sdk.testing``: ``FakeSource``, a backend under the real sync runner.

``API_VERSION`` is (major, minor): a name of ``__all__`` is removed or changes meaning
only with a new major version; additions raise the minor version.
"""

from __future__ import annotations

from svcproxy.convert import node_to_pb, state_to_pb
from svcproxy.durations import parse_duration
from svcproxy.model import (
    DEFAULT_AFFINITY_TIMEOUT,
    Endpoint,
    LoadBalancerIngress,
    NodeInfo,
    Protocol,
    ServicePort,
    ServicePortKey,
    ServicePortState,
    ServiceType,
    SessionAffinity,
    TrafficPolicy,
    ip_family,
    normalize_cidr,
    normalize_ip,
    of_family,
)
from svcproxy.sdk import (
    netlink,  # the module: netlink messages and attributes as bytes
    rtnetlink,  # the module: this namespace's addresses and default routes
    run,  # the module: run.run(backend, client)
)
from svcproxy.sdk.addresses import node_port_ips, primary_node_ips
from svcproxy.sdk.agent import add_agent_arguments, cidr_list, config_from_args, run_agent
from svcproxy.sdk.backend import Backend, Changes, NodeState
from svcproxy.sdk.client import NodeStateClient, WatchRefused, tls_credentials
from svcproxy.sdk.config import NodeConfig
from svcproxy.sdk.context import (
    IPTABLES_MODES,
    FamilyContext,
    LocalTraffic,
    NodeContext,
    ProxyMode,
    interface_addresses,
    resolve_context,
)
from svcproxy.sdk.plugins import ENTRY_POINT_GROUP, BackendPlugin, installed_backends
from svcproxy.sdk.refusals import (
    Refusals,
    TooManyRefused,
    invalid_values,
    isolate,
    isolate_versions,
)
from svcproxy.sdk.refusals import describe as describe_service_port
from svcproxy.sdk.stages import Applied, Delta, Drift, StagedBackend

API_VERSION = (1, 5)

__all__ = [
    "API_VERSION",
    "DEFAULT_AFFINITY_TIMEOUT",
    "ENTRY_POINT_GROUP",
    "IPTABLES_MODES",
    "Applied",
    "Backend",
    "BackendPlugin",
    "Changes",
    "Delta",
    "Drift",
    "Endpoint",
    "FamilyContext",
    "LoadBalancerIngress",
    "LocalTraffic",
    "NodeConfig",
    "NodeContext",
    "NodeInfo",
    "NodeState",
    "NodeStateClient",
    "Protocol",
    "ProxyMode",
    "Refusals",
    "ServicePort",
    "ServicePortKey",
    "ServicePortState",
    "ServiceType",
    "SessionAffinity",
    "StagedBackend",
    "TooManyRefused",
    "TrafficPolicy",
    "WatchRefused",
    "add_agent_arguments",
    "cidr_list",
    "config_from_args",
    "describe_service_port",
    "installed_backends",
    "interface_addresses",
    "invalid_values",
    "ip_family",
    "isolate",
    "isolate_versions",
    "netlink",
    "node_port_ips",
    "node_to_pb",
    "normalize_cidr",
    "normalize_ip",
    "of_family",
    "parse_duration",
    "primary_node_ips",
    "resolve_context",
    "run",
    "rtnetlink",
    "run_agent",
    "state_to_pb",
    "tls_credentials",
]

