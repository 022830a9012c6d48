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


_SOCKET_NO_NAT = ("a connection made on the node goes straight to the endpoint chosen at "
                  "connect(): no NAT, so nothing is masqueraded (as Cilium's socket LB)")
_OUTSIDE = ("also checks connections from outside the node, which no socket hook sees: "
            "they are the packet path's (the ebpf case runs nft next to the programs)")
_EBPF_NO_NAT = (("test_masquerade_and_hairpin", _SOCKET_NO_NAT),
                ("test_masquerade_all_flag", _SOCKET_NO_NAT))
BACKENDS: tuple[BackendCase, ...] = (
    BackendCase("nft"),
    BackendCase("iptables"),
    BackendCase("nft", local=True, label="nft-local"),
    BackendCase("iptables", local=True, label="iptables-local"),
    BackendCase("ebpf", socket_level=True, not_applicable=_EBPF_NO_NAT),
    BackendCase("ebpf", socket_level=True, not_applicable=_EBPF_NO_NAT, local=True,
                label="ebpf-local"),
    # The socket programs alone (no nft next to them): every row from node1 and its pods.
    BackendCase("ebpf", ("--ebpf-packet-path", "none"), socket_level=True, label="ebpf-only",
                not_applicable=(
        *_EBPF_NO_NAT,
        *((row, _OUTSIDE) for row in (
            "test_node_port_on_selected_addresses", "test_load_balancer_source_ranges",
            "test_external_ips", "test_external_traffic_policy_local",
            "test_no_endpoints_reject_and_unallocated_drop")),
    )),
)
if os.environ.get("SVCPROXY_IPVS_GUEST") == "1":
    BACKENDS += (BackendCase("ipvs"), BackendCase("ipvs", local=True, label="ipvs-local"))
