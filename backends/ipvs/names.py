"""The names of what the IPVS backend owns in the kernel (pure constants).

kube-proxy's IPVS mode's names, so that a node taken over from kube-proxy is adopted
and cleaned up: the dummy interface the service addresses are bound to, the ipsets
(``KUBE-<base>`` for IPv4, ``KUBE-6-<base>`` for IPv6, as kube-proxy's IPv6 proxier),
the iptables chains and the tables they live in, the masquerade mark, and the firewall
marks of the externalTrafficPolicy=Local short-circuits; plus the annotation choosing a
service's scheduler.
"""

from __future__ import annotations

DUMMY_INTERFACE = "kube-ipvs0"
SCHEDULER_ANNOTATION = "svcproxy.io/ipvs-scheduler"

# The ipsets' bases.
LOOP_BACK = "LOOP-BACK"
CLUSTER_IP = "CLUSTER-IP"
EXTERNAL_IP = "EXTERNAL-IP"
EXTERNAL_IP_LOCAL = "EXTERNAL-IP-LOCAL"
LOAD_BALANCER = "LOAD-BALANCER"
LOAD_BALANCER_LOCAL = "LOAD-BALANCER-LOCAL"
LOAD_BALANCER_FW = "LOAD-BALANCER-FW"
LOAD_BALANCER_SOURCE_IP = "LOAD-BALANCER-SOURCE-IP"
LOAD_BALANCER_SOURCE_CIDR = "LOAD-BALANCER-SOURCE-CIDR"
NODE_PORT_TCP = "NODE-PORT-TCP"
NODE_PORT_LOCAL_TCP = "NODE-PORT-LOCAL-TCP"
NODE_PORT_UDP = "NODE-PORT-UDP"
NODE_PORT_LOCAL_UDP = "NODE-PORT-LOCAL-UDP"
NODE_PORT_SCTP = "NODE-PORT-SCTP-HASH"
NODE_PORT_LOCAL_SCTP = "NODE-PORT-LOCAL-SCTP-HASH"
HEALTH_CHECK_NODE_PORT = "HEALTH-CHECK-NODE-PORT"
IPVS_IPS = "IPVS-IPS"
EXTERNAL_LOCAL_FWMARK = "EXTERNAL-LOCAL-FWMARK"
NO_LOCAL_ENDPOINTS = "NO-LOCAL-ENDPOINTS"

MAX_NAME = 31  # ipset's limit


def set_name(base: str, family: int) -> str:
    """KUBE-<base> for IPv4, KUBE-6-<base> for IPv6 (cut to ipset's 31 characters)."""
    return (f"KUBE-{base}" if family == 4 else f"KUBE-6-{base}")[:MAX_NAME]


def temp_name(family: int, index: int) -> str:
    """The temporary set a full sync fills for the ``index``-th kind, then swaps in."""
    return f"KUBE-TMP-{family}-{index}"


# The iptables chains, by table.
NAT_CHAINS = ("KUBE-SERVICES", "KUBE-POSTROUTING", "KUBE-MARK-MASQ", "KUBE-NODE-PORT",
              "KUBE-LOAD-BALANCER", "KUBE-MARK-NONLOCAL")
FILTER_CHAINS = ("KUBE-FORWARD", "KUBE-NODE-PORT", "KUBE-PROXY-FIREWALL",
                 "KUBE-SOURCE-RANGES-FIREWALL", "KUBE-IPVS-FILTER")
MANGLE_CHAINS = ("KUBE-EXTERNAL-LOCAL", "KUBE-EXTERNAL-LOCAL-NODE")
CHAINS = {"nat": NAT_CHAINS, "filter": FILTER_CHAINS, "mangle": MANGLE_CHAINS}
TABLES = ("filter", "nat", "mangle")

MASQ_MARK = "0x4000"
FWMARK_MASK = "0xffff0000"
MARK_SHIFT = 16
MAX_MARKS = 0xFFFF


def is_our_fwmark(mark: int) -> bool:
    """Marks this backend allocates: bits 16-31 only (clear of the 0x4000 masquerade bit)."""
    return mark > 0 and not mark & ((1 << MARK_SHIFT) - 1)
