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
    # Balances at the socket: node1's processes (and probes from node1 and its pods) run
    # in a cgroup the lab makes (tests/support/netns/socket_level.py).
    socket_level: bool = False
    # Scenario (test function name) -> why it does not apply to this backend.
    not_applicable: tuple[tuple[str, str], ...] = ()
    label: str = ""  # the test id, when one backend runs in two cases
    # Local mode: no frontend address, a kubeconfig of the stand-in apiserver; the backend
    # computes its node's state in process (and the scenarios check it equals split mode's).
    local: bool = False

    def __str__(self) -> str:
        return self.label or self.name

    def skip_reason(self, scenario: str) -> str:
        return dict(self.not_applicable).get(scenario, "")


_OUTSIDE = ("also checks connections from outside the node, which no socket hook sees: "
            "they are the packet path's (the ebpf case runs nft next to the programs)")
_NO_PACKET_PATH = ("--masquerade-all changes what the packet path NATs (here a pod's process "
                   "outside --ebpf-cgroup); the socket programs alone never NAT, as "
                   "test_masquerade_and_hairpin checks")
BACKENDS: tuple[BackendCase, ...] = (
    BackendCase("nft"),
    BackendCase("iptables"),
    BackendCase("nft", local=True, label="nft-local"),
    BackendCase("iptables", local=True, label="iptables-local"),
    BackendCase("ebpf", socket_level=True),
    BackendCase("ebpf", socket_level=True, local=True, label="ebpf-local"),
    # The socket programs alone (no nft next to them): every row from node1 and its pods.
    BackendCase("ebpf", ("--ebpf-packet-path", "none"), socket_level=True, label="ebpf-only",
                not_applicable=(
        ("test_masquerade_all_flag", _NO_PACKET_PATH),
        *((row, _OUTSIDE) for row in (
            "test_node_port_on_selected_addresses", "test_load_balancer_source_ranges",
            "test_external_ips", "test_external_traffic_policy_local",
            "test_no_endpoints_reject_and_unallocated_drop")),
    )),
)
# ipvs-local runs only what local mode changes for ipvs (the node's state computed in
# process, kube-proxy's flags reaching the backend): the emulated guest is slow, and the
# rest repeats the ipvs case's programming.
_IPVS_LOCAL_RUNS = ("test_cluster_ip_protocols_ports_and_target_port_names",
                    "test_external_traffic_policy_local",
                    "test_local_mode_follows_the_apiserver_and_a_difference_is_caught")
_IPVS_LOCAL_REPEATS = (
    "repeats the ipvs case: local mode changes where the node's state is computed, not what "
    "the ipvs backend programs (nft-local, iptables-local and ebpf-local compare that state "
    "with split mode's after every scenario)")
_SCENARIOS = (
    "test_cluster_ip_protocols_ports_and_target_port_names", "test_node_port_on_selected_addresses",
    "test_load_balancer_source_ranges", "test_external_ips",
    "test_session_affinity_client_ip_until_timeout", "test_external_traffic_policy_local",
    "test_external_policy_local_short_circuit_uses_cluster_endpoints",
    "test_external_policy_local_without_endpoints_is_rejected",
    "test_node_ports_on_loopback_only_where_kube_proxy_serves_them",
    "test_internal_traffic_policy_local", "test_terminating_endpoints_fallback",
    "test_topology_hints", "test_no_endpoints_reject_and_unallocated_drop",
    "test_masquerade_and_hairpin", "test_masquerade_all_flag",
    "test_local_mode_follows_the_apiserver_and_a_difference_is_caught",
    "test_cleanup_removes_everything_the_backend_made_and_nothing_else")
if os.environ.get("SVCPROXY_IPVS_GUEST") == "1":
    BACKENDS += (BackendCase("ipvs"), BackendCase(
        "ipvs", local=True, label="ipvs-local", not_applicable=tuple(
            (name, _IPVS_LOCAL_REPEATS) for name in _SCENARIOS if name not in _IPVS_LOCAL_RUNS)))
