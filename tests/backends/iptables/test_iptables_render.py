"""Rendered rules against the exact rules of the seed (kube-proxy v1.26, proxier_test.go), and
the behaviours of kube-proxy's iptables mode the seed leaves out.

The seed documents what kube-proxy writes for a NodePort, a LoadBalancer with
source ranges and an ExternalIP service; ours must write the same lines.
"""
# ruff: noqa: E501

# Seed 003, NodePort example: the nat table (rules #1-#16).
SEED_NODEPORT_NAT = [
    '-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN',
    '-A KUBE-POSTROUTING -j MARK --xor-mark 0x4000',
    '-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE',
    '-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000',
    '-A KUBE-SERVICES -m comment --comment "ns1/svc1:p80 cluster IP" -m tcp -p tcp -d 172.30.0.41 --dport 80 -j KUBE-SVC-XPGD46QRK7WJZT7O',
    '-A KUBE-NODEPORTS -m comment --comment ns1/svc1:p80 -m tcp -p tcp --dport 3001 -j KUBE-EXT-XPGD46QRK7WJZT7O',
    '-A KUBE-SVC-XPGD46QRK7WJZT7O -m comment --comment "ns1/svc1:p80 cluster IP" -m tcp -p tcp -d 172.30.0.41 --dport 80 ! -s 10.0.0.0/8 -j KUBE-MARK-MASQ',
    '-A KUBE-EXT-XPGD46QRK7WJZT7O -m comment --comment "masquerade traffic for ns1/svc1:p80 external destinations" -j KUBE-MARK-MASQ',
    '-A KUBE-EXT-XPGD46QRK7WJZT7O -j KUBE-SVC-XPGD46QRK7WJZT7O',
    '-A KUBE-SVC-XPGD46QRK7WJZT7O -m comment --comment "ns1/svc1:p80 -> 10.180.0.1:80" -m statistic --mode random --probability 0.5000000000 -j KUBE-SEP-SXIVWICOYRO3J4NJ',
    '-A KUBE-SVC-XPGD46QRK7WJZT7O -m comment --comment "ns1/svc1:p80 -> 10.180.0.2:80" -j KUBE-SEP-LXVODXWDISEETFEF',
    '-A KUBE-SEP-SXIVWICOYRO3J4NJ -m comment --comment ns1/svc1:p80 -s 10.180.0.1 -j KUBE-MARK-MASQ',
    '-A KUBE-SEP-SXIVWICOYRO3J4NJ -m comment --comment ns1/svc1:p80 -m tcp -p tcp -j DNAT --to-destination 10.180.0.1:80',
    '-A KUBE-SEP-LXVODXWDISEETFEF -m comment --comment ns1/svc1:p80 -s 10.180.0.2 -j KUBE-MARK-MASQ',
    '-A KUBE-SEP-LXVODXWDISEETFEF -m comment --comment ns1/svc1:p80 -m tcp -p tcp -j DNAT --to-destination 10.180.0.2:80',
    '-A KUBE-SERVICES -m comment --comment "kubernetes service nodeports; NOTE: this must be the last rule in this chain" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS',
]

# Seed 003: the filter table's KUBE-FORWARD rules of every example.
SEED_FORWARD = [
    '-A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP',
    '-A KUBE-FORWARD -m comment --comment "kubernetes forwarding rules" -m mark --mark 0x4000/0x4000 -j ACCEPT',
    '-A KUBE-FORWARD -m comment --comment "kubernetes forwarding conntrack rule" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT',
]

# Seed 003, LoadBalancer example: KUBE-PROXY-FIREWALL in the filter table.
SEED_LB_FILTER = [
    '-A KUBE-PROXY-FIREWALL -m comment --comment "ns1/svc1:p80 traffic not accepted by KUBE-FW-XPGD46QRK7WJZT7O" -m tcp -p tcp -d 1.2.3.4 --dport 80 -j DROP',
    '-A KUBE-PROXY-FIREWALL -m comment --comment "ns1/svc1:p80 traffic not accepted by KUBE-FW-XPGD46QRK7WJZT7O" -m tcp -p tcp -d 5.6.7.8 --dport 80 -j DROP',
]

# Seed 003, LoadBalancer example: the nat table.
SEED_LB_NAT = [
    '-A KUBE-NODEPORTS -m comment --comment ns1/svc1:p80 -m tcp -p tcp --dport 3001 -j KUBE-EXT-XPGD46QRK7WJZT7O',
    '-A KUBE-SERVICES -m comment --comment "ns1/svc1:p80 cluster IP" -m tcp -p tcp -d 172.30.0.41 --dport 80 -j KUBE-SVC-XPGD46QRK7WJZT7O',
    '-A KUBE-SERVICES -m comment --comment "ns1/svc1:p80 loadbalancer IP" -m tcp -p tcp -d 1.2.3.4 --dport 80 -j KUBE-FW-XPGD46QRK7WJZT7O',
    '-A KUBE-SERVICES -m comment --comment "ns1/svc1:p80 loadbalancer IP" -m tcp -p tcp -d 5.6.7.8 --dport 80 -j KUBE-FW-XPGD46QRK7WJZT7O',
    '-A KUBE-SERVICES -m comment --comment "kubernetes service nodeports; NOTE: this must be the last rule in this chain" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS',
    '-A KUBE-EXT-XPGD46QRK7WJZT7O -m comment --comment "masquerade traffic for ns1/svc1:p80 external destinations" -j KUBE-MARK-MASQ',
    '-A KUBE-EXT-XPGD46QRK7WJZT7O -j KUBE-SVC-XPGD46QRK7WJZT7O',
    '-A KUBE-FW-XPGD46QRK7WJZT7O -m comment --comment "ns1/svc1:p80 loadbalancer IP" -s 192.168.0.0/24 -j KUBE-EXT-XPGD46QRK7WJZT7O',
    '-A KUBE-FW-XPGD46QRK7WJZT7O -m comment --comment "ns1/svc1:p80 loadbalancer IP" -s 203.0.113.0/25 -j KUBE-EXT-XPGD46QRK7WJZT7O',
    '-A KUBE-FW-XPGD46QRK7WJZT7O -m comment --comment "ns1/svc1:p80 loadbalancer IP" -s 1.2.3.4 -j KUBE-EXT-XPGD46QRK7WJZT7O',
    '-A KUBE-FW-XPGD46QRK7WJZT7O -m comment --comment "ns1/svc1:p80 loadbalancer IP" -s 5.6.7.8 -j KUBE-EXT-XPGD46QRK7WJZT7O',
    '-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000',
    '-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN',
    '-A KUBE-POSTROUTING -j MARK --xor-mark 0x4000',
    '-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE',
    '-A KUBE-SEP-SXIVWICOYRO3J4NJ -m comment --comment ns1/svc1:p80 -s 10.180.0.1 -j KUBE-MARK-MASQ',
    '-A KUBE-SEP-SXIVWICOYRO3J4NJ -m comment --comment ns1/svc1:p80 -m tcp -p tcp -j DNAT --to-destination 10.180.0.1:80',
    '-A KUBE-SVC-XPGD46QRK7WJZT7O -m comment --comment "ns1/svc1:p80 cluster IP" -m tcp -p tcp -d 172.30.0.41 --dport 80 ! -s 10.0.0.0/8 -j KUBE-MARK-MASQ',
    '-A KUBE-SVC-XPGD46QRK7WJZT7O -m comment --comment "ns1/svc1:p80 -> 10.180.0.1:80" -j KUBE-SEP-SXIVWICOYRO3J4NJ',
]

# Seed 003, ExternalIP example: the nat table.
SEED_EXTERNAL_IP_NAT = [
    '-A KUBE-SERVICES -m comment --comment "ns1/svc1:p80 cluster IP" -m tcp -p tcp -d 172.30.0.41 --dport 80 -j KUBE-SVC-XPGD46QRK7WJZT7O',
    '-A KUBE-SERVICES -m comment --comment "ns1/svc1:p80 external IP" -m tcp -p tcp -d 192.168.99.11 --dport 80 -j KUBE-EXT-XPGD46QRK7WJZT7O',
    '-A KUBE-SERVICES -m comment --comment "kubernetes service nodeports; NOTE: this must be the last rule in this chain" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS',
    '-A KUBE-EXT-XPGD46QRK7WJZT7O -m comment --comment "masquerade traffic for ns1/svc1:p80 external destinations" -j KUBE-MARK-MASQ',
    '-A KUBE-EXT-XPGD46QRK7WJZT7O -j KUBE-SVC-XPGD46QRK7WJZT7O',
    '-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000',
    '-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN',
    '-A KUBE-POSTROUTING -j MARK --xor-mark 0x4000',
    '-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE',
    '-A KUBE-SEP-SXIVWICOYRO3J4NJ -m comment --comment ns1/svc1:p80 -s 10.180.0.1 -j KUBE-MARK-MASQ',
    '-A KUBE-SEP-SXIVWICOYRO3J4NJ -m comment --comment ns1/svc1:p80 -m tcp -p tcp -j DNAT --to-destination 10.180.0.1:80',
    '-A KUBE-SEP-ZX7GRIZKSNUQ3LAJ -m comment --comment ns1/svc1:p80 -s 10.180.2.1 -j KUBE-MARK-MASQ',
    '-A KUBE-SEP-ZX7GRIZKSNUQ3LAJ -m comment --comment ns1/svc1:p80 -m tcp -p tcp -j DNAT --to-destination 10.180.2.1:80',
    '-A KUBE-SVC-XPGD46QRK7WJZT7O -m comment --comment "ns1/svc1:p80 cluster IP" -m tcp -p tcp -d 172.30.0.41 --dport 80 ! -s 10.0.0.0/8 -j KUBE-MARK-MASQ',
    '-A KUBE-SVC-XPGD46QRK7WJZT7O -m comment --comment "ns1/svc1:p80 -> 10.180.0.1:80" -m statistic --mode random --probability 0.5000000000 -j KUBE-SEP-SXIVWICOYRO3J4NJ',
    '-A KUBE-SVC-XPGD46QRK7WJZT7O -m comment --comment "ns1/svc1:p80 -> 10.180.2.1:80" -j KUBE-SEP-ZX7GRIZKSNUQ3LAJ',
]


# ---------------------------------------------------------------------------

from svcproxy.backends.iptables.render import FamilyConfig, render_service  # noqa: E402
from svcproxy.backends.iptables.render_plan import Planner, large_cluster, render  # noqa: E402
from svcproxy.backends.iptables.render_restore import restore_text  # noqa: E402
from svcproxy.model import (  # noqa: E402
    Endpoint,
    LoadBalancerIngress,
    Protocol,
    ServicePort,
    ServicePortKey,
    ServicePortState,
    ServiceType,
    SessionAffinity,
    TrafficPolicy,
)

KEY = ServicePortKey("ns1", "svc1", "p80", Protocol.TCP)
# The seed's rules: cluster CIDR 10.0.0.0/8, no --random-fully, localhost NodePorts on.
SEED_CONFIG = FamilyConfig(if_local="-s 10.0.0.0/8", if_not_local="! -s 10.0.0.0/8",
                           random_fully=False, localhost_nodeports=True, node_ip="192.168.0.2")


def endpoints(*ips: str, port: int = 80, **flags: bool) -> dict[str, Endpoint]:
    chosen = {"internal": True, "external": True, "cluster": True} | flags
    chosen.setdefault("local", chosen.get("is_local", False))
    return {ip: Endpoint(ip, port, **chosen) for ip in ips}


def state(eps: dict[str, Endpoint], **fields: object) -> ServicePortState:
    base: dict[str, object] = {"cluster_ips": ("172.30.0.41",), "port": 80,
                               "has_endpoints": bool(eps)}
    return ServicePortState(ServicePort(KEY, **(base | fields)), eps)  # type: ignore[arg-type]


def rules(states: list[ServicePortState], cfg: FamilyConfig = SEED_CONFIG) -> dict[str, list[str]]:
    """Rule lines per table of a full sync of these service ports."""
    large = large_cluster(states)
    plan = Planner(cfg).full({s.key: render(s, (cfg,), large) for s in states})
    tables: dict[str, list[str]] = {}
    table = ""
    for line in restore_text(plan.tables).splitlines():
        if line.startswith("*"):
            table = line[1:]
            tables[table] = []
        elif line.startswith("-"):
            tables[table].append(line)
    return tables


def test_nodeport_service_writes_the_seed_rules() -> None:
    svc = state(endpoints("10.180.0.1", "10.180.0.2"), type=ServiceType.NODE_PORT, node_port=3001)
    out = rules([svc])
    assert sorted(out["nat"]) == sorted(SEED_NODEPORT_NAT)
    assert out["filter"][:3] == SEED_FORWARD
    # The seed's kube-proxy predates KUBE-FIREWALL in kube-proxy: the route_localnet guard.
    assert out["filter"][3:] == [
        '-A KUBE-FIREWALL -m comment --comment "block incoming localnet connections" '
        "-d 127.0.0.0/8 ! -s 127.0.0.0/8 -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP"
    ]


def test_nodeport_jump_is_the_last_rule_of_kube_services() -> None:
    svc = state(endpoints("10.180.0.1"), type=ServiceType.NODE_PORT, node_port=3001,
                external_ips=("192.168.99.11",))
    services = [line for line in rules([svc])["nat"] if line.startswith("-A KUBE-SERVICES ")]
    assert "-j KUBE-NODEPORTS" in services[-1]
    assert len(services) == 3


def test_load_balancer_with_source_ranges_writes_the_seed_rules() -> None:
    svc = state(endpoints("10.180.0.1"), type=ServiceType.LOAD_BALANCER, node_port=3001,
                load_balancer_ingress=(LoadBalancerIngress("1.2.3.4"), LoadBalancerIngress("5.6.7.8")),
                load_balancer_source_ranges=("192.168.0.0/24", "203.0.113.0/25"))
    out = rules([svc])
    # Today's kube-proxy ends KUBE-FW-* with a comment-only rule explaining the drop.
    last = ('-A KUBE-FW-XPGD46QRK7WJZT7O -m comment --comment "other traffic to ns1/svc1:p80 '
            'will be dropped by KUBE-PROXY-FIREWALL"')
    assert sorted(out["nat"]) == sorted([*SEED_LB_NAT, last])
    assert [r for r in out["filter"] if "KUBE-PROXY-FIREWALL" in r] == SEED_LB_FILTER


def test_firewall_lets_the_node_in_only_when_a_range_holds_its_ip() -> None:
    svc = state(endpoints("10.180.0.1"), type=ServiceType.LOAD_BALANCER, node_port=3001,
                load_balancer_ingress=(LoadBalancerIngress("1.2.3.4"),),
                load_balancer_source_ranges=("203.0.113.0/25",))
    fw = [r for r in rules([svc])["nat"] if r.startswith("-A KUBE-FW-")]
    assert not any("-s 1.2.3.4" in r for r in fw)


def test_external_ip_service_writes_the_seed_rules() -> None:
    svc = state(endpoints("10.180.0.1", "10.180.2.1"), external_ips=("192.168.99.11",))
    assert sorted(rules([svc])["nat"]) == sorted(SEED_EXTERNAL_IP_NAT)


def test_proxy_mode_lb_ingress_is_left_to_the_load_balancer() -> None:
    svc = state(endpoints("10.180.0.1"), type=ServiceType.LOAD_BALANCER, node_port=3001,
                load_balancer_ingress=(LoadBalancerIngress("1.2.3.4", "Proxy"),))
    assert not any("1.2.3.4" in r for t in rules([svc]).values() for r in t)


def test_service_without_endpoints_is_rejected_in_the_filter_table_on_every_address() -> None:
    svc = state({}, type=ServiceType.LOAD_BALANCER, node_port=3001, external_ips=("192.168.99.11",),
                load_balancer_ingress=(LoadBalancerIngress("1.2.3.4"),))
    out = rules([svc])
    comment = '-m comment --comment "ns1/svc1:p80 has no endpoints"'
    assert [r for r in out["filter"] if "REJECT" in r] == [
        f"-A KUBE-SERVICES {comment} -m tcp -p tcp -d 172.30.0.41 --dport 80 -j REJECT",
        f"-A KUBE-EXTERNAL-SERVICES {comment} -m tcp -p tcp -d 192.168.99.11 --dport 80 -j REJECT",
        f"-A KUBE-EXTERNAL-SERVICES {comment} -m tcp -p tcp -d 1.2.3.4 --dport 80 -j REJECT",
        f"-A KUBE-EXTERNAL-SERVICES {comment} -m addrtype --dst-type LOCAL -m tcp -p tcp --dport 3001 -j REJECT",
    ]
    assert not any("XPGD46QRK7WJZT7O" in r for r in out["nat"])


def test_external_policy_local_keeps_source_and_short_circuits_pods_and_node() -> None:
    eps = endpoints("10.180.0.1", external=False) | endpoints("10.180.1.1", is_local=True)
    svc = state(eps, type=ServiceType.NODE_PORT, node_port=3001,
                external_traffic_policy=TrafficPolicy.LOCAL, health_check_node_port=30000)
    out = rules([svc])
    ext = [r for r in out["nat"] if r.startswith("-A KUBE-EXT-")]
    assert ext == [
        '-A KUBE-EXT-XPGD46QRK7WJZT7O -m comment --comment "pod traffic for ns1/svc1:p80 external destinations" -s 10.0.0.0/8 -j KUBE-SVC-XPGD46QRK7WJZT7O',
        '-A KUBE-EXT-XPGD46QRK7WJZT7O -m comment --comment "masquerade LOCAL traffic for ns1/svc1:p80 external destinations" -m addrtype --src-type LOCAL -j KUBE-MARK-MASQ',
        '-A KUBE-EXT-XPGD46QRK7WJZT7O -m comment --comment "route LOCAL traffic for ns1/svc1:p80 external destinations" -m addrtype --src-type LOCAL -j KUBE-SVC-XPGD46QRK7WJZT7O',
        "-A KUBE-EXT-XPGD46QRK7WJZT7O -j KUBE-SVL-XPGD46QRK7WJZT7O",
    ]
    svl = [r for r in out["nat"] if r.startswith("-A KUBE-SVL-")]
    assert len(svl) == 1 and "10.180.1.1:80" in svl[0]
    svc_rules = [r for r in out["nat"] if r.startswith("-A KUBE-SVC-") and "->" in r]
    assert len(svc_rules) == 2
    assert ('-A KUBE-NODEPORTS -m comment --comment "ns1/svc1:p80 health check node port" '
            "-m tcp -p tcp --dport 30000 -j ACCEPT") in out["filter"]


def test_external_policy_local_without_local_endpoints_drops_external_traffic() -> None:
    svc = state(endpoints("10.180.0.1", external=False), type=ServiceType.NODE_PORT,
                node_port=3001, external_traffic_policy=TrafficPolicy.LOCAL)
    out = rules([svc])
    assert ('-A KUBE-EXTERNAL-SERVICES -m comment --comment "ns1/svc1:p80 has no local endpoints" '
            "-m addrtype --dst-type LOCAL -m tcp -p tcp --dport 3001 -j DROP") in out["filter"]
    assert not any(r.startswith("-A KUBE-SVL-") for r in out["nat"])
    assert "-A KUBE-EXT-XPGD46QRK7WJZT7O -j KUBE-SVL-XPGD46QRK7WJZT7O" not in out["nat"]


def test_internal_policy_local_without_local_endpoints_drops_cluster_ip_traffic() -> None:
    svc = state(endpoints("10.180.0.1", internal=False),
                internal_traffic_policy=TrafficPolicy.LOCAL)
    out = rules([svc])
    assert ('-A KUBE-SERVICES -m comment --comment "ns1/svc1:p80 has no local endpoints" '
            "-m tcp -p tcp -d 172.30.0.41 --dport 80 -j DROP") in out["filter"]
    assert not any("XPGD46QRK7WJZT7O" in r for r in out["nat"])


def test_client_ip_affinity_uses_recent_with_the_timeout() -> None:
    svc = state(endpoints("10.180.0.1", "10.180.0.2"),
                session_affinity=SessionAffinity.CLIENT_IP, session_affinity_timeout=30)
    nat = rules([svc])["nat"]
    assert ('-A KUBE-SVC-XPGD46QRK7WJZT7O -m comment --comment "ns1/svc1:p80 -> 10.180.0.1:80" '
            "-m recent --name KUBE-SEP-SXIVWICOYRO3J4NJ --rcheck --seconds 30 --reap "
            "-j KUBE-SEP-SXIVWICOYRO3J4NJ") in nat
    assert ("-A KUBE-SEP-SXIVWICOYRO3J4NJ -m comment --comment ns1/svc1:p80 -m recent "
            "--name KUBE-SEP-SXIVWICOYRO3J4NJ --set -m tcp -p tcp -j DNAT "
            "--to-destination 10.180.0.1:80") in nat


def test_probabilities_give_every_endpoint_an_equal_share() -> None:
    svc = state(endpoints(*(f"10.180.0.{i}" for i in range(1, 5))))
    chances = [r.split("--probability ")[1].split()[0] for r in rules([svc])["nat"]
               if r.startswith("-A KUBE-SVC-") and "--probability" in r]
    assert chances == ["0.2500000000", "0.3333333333", "0.5000000000"]


def test_comments_are_omitted_above_a_thousand_endpoints() -> None:
    big = [ServicePortState(ServicePort(ServicePortKey("ns", f"s{i}", "", Protocol.TCP),
                                        cluster_ips=(f"172.30.{i // 250}.{i % 250 + 1}",), port=80,
                                        has_endpoints=True),
                            endpoints(f"10.1.{i // 250}.{i % 250 + 1}", f"10.2.{i // 250}.{i % 250 + 1}"))
           for i in range(501)]
    nat = rules(big)["nat"]
    assert not any("--comment" in r for r in nat if r.startswith(("-A KUBE-SEP-", "-A KUBE-SVC-"))
                   and "cluster IP" not in r)
    small = rules(big[:10])["nat"]
    assert any("--comment" in r for r in small if r.startswith("-A KUBE-SEP-"))


def test_ipv6_service_uses_its_family_and_brackets_endpoints() -> None:
    svc = state(endpoints("fd00:10::1", "10.180.0.1"), cluster_ips=("172.30.0.41", "fd00:30::41"),
                type=ServiceType.NODE_PORT, node_port=3001)
    v6 = rules([svc], FamilyConfig(family=6, if_local="-s fd00:10::/64",
                                   if_not_local="! -s fd00:10::/64"))
    nat = v6["nat"]
    assert any("-d fd00:30::41 --dport 80" in r for r in nat)
    assert any("DNAT --to-destination [fd00:10::1]:80" in r for r in nat)
    assert not any("10.180.0.1" in r or "172.30.0.41" in r for r in nat)
    assert any("--dst-type LOCAL ! -d ::1/128 -j KUBE-NODEPORTS" in r for r in nat)
    assert not any("KUBE-FIREWALL" in r for r in v6["filter"])


def test_service_without_cluster_ip_in_a_family_renders_nothing_there() -> None:
    assert render_service(state(endpoints("10.180.0.1")), FamilyConfig(family=6)) is None


def test_masquerade_all_marks_every_cluster_ip_connection() -> None:
    cfg = FamilyConfig(masquerade_all=True, if_not_local="! -s 10.0.0.0/8")
    nat = rules([state(endpoints("10.180.0.1"))], cfg)["nat"]
    assert ('-A KUBE-SVC-XPGD46QRK7WJZT7O -m comment --comment "ns1/svc1:p80 cluster IP" '
            "-m tcp -p tcp -d 172.30.0.41 --dport 80 -j KUBE-MARK-MASQ") in nat


def test_nodeport_addresses_limit_the_nodeports_jump() -> None:
    svc = state(endpoints("10.180.0.1"), type=ServiceType.NODE_PORT, node_port=3001)
    nat = rules([svc], FamilyConfig(nodeport_ips=("192.168.0.2", "127.0.0.1")))["nat"]
    jumps = [r for r in nat if r.endswith("-j KUBE-NODEPORTS")]
    assert len(jumps) == 1 and "-d 192.168.0.2 " in jumps[0]


def test_localhost_nodeports_off_excludes_loopback() -> None:
    svc = state(endpoints("10.180.0.1"), type=ServiceType.NODE_PORT, node_port=3001)
    nat = rules([svc], FamilyConfig())["nat"]
    assert any("--dst-type LOCAL ! -d 127.0.0.0/8 -j KUBE-NODEPORTS" in r for r in nat)


def test_service_cidr_rejects_wrong_ports_and_drops_unallocated_ips() -> None:
    out = rules([state(endpoints("10.180.0.1"))], FamilyConfig(service_cidrs=("172.30.0.0/16",)))
    services = [r for r in out["filter"] if r.startswith("-A KUBE-SERVICES ")]
    assert services == [
        '-A KUBE-SERVICES -m comment --comment "no such service port" -d 172.30.0.41 -j REJECT',
        '-A KUBE-SERVICES -m comment --comment "unallocated service IP" -d 172.30.0.0/16 -j DROP',
    ]


def test_protocols_match_with_their_own_module() -> None:
    for proto in (Protocol.UDP, Protocol.SCTP):
        key = ServicePortKey("ns1", "svc1", "p80", proto)
        svc = ServicePortState(ServicePort(key, cluster_ips=("172.30.0.41",), port=80,
                                           has_endpoints=True), endpoints("10.180.0.1"))
        name = proto.value.lower()
        assert any(f"-m {name} -p {name} -j DNAT" in r for r in rules([svc])["nat"])


def test_source_ranges_of_the_other_family_block_this_one() -> None:
    svc = state(endpoints("fd00:10::1"), cluster_ips=("fd00:30::41",),
                type=ServiceType.LOAD_BALANCER, node_port=3001,
                load_balancer_ingress=(LoadBalancerIngress("fd00:60::1"),),
                load_balancer_source_ranges=("192.168.0.0/24",))
    out = rules([svc], FamilyConfig(family=6))
    fw = [r for r in out["nat"] if r.startswith("-A KUBE-FW-")]
    assert fw == ['-A KUBE-FW-XPGD46QRK7WJZT7O -m comment --comment "other traffic to '
                  'ns1/svc1:p80 will be dropped by KUBE-PROXY-FIREWALL"']
    assert any("-d fd00:60::1 --dport 80 -j DROP" in r for r in out["filter"])
