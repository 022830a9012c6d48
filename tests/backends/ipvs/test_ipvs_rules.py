"""The fixed iptables rules and the ipset restore text of IPVS mode (pure)."""

from __future__ import annotations

import argparse

import pytest

from svcproxy.backends.ipvs import cli
from svcproxy.backends.ipvs import ipsets as S
from svcproxy.backends.ipvs import names as N
from svcproxy.backends.ipvs import rules as R
from svcproxy.backends.ipvs.options import IpvsOptions, OptionError
from svcproxy.sdk.config import NodeConfig

POD_CIDR = R.LocalDetect(cidrs=("10.244.0.0/16",))


def _text(family: int = 4, masquerade_all: bool = False,
          local: R.LocalDetect = POD_CIDR) -> str:
    tables = {"nat": R.nat_rules(family, masquerade_all, local), "filter": R.filter_rules(family),
              "mangle": R.mangle_rules(family, local)}
    return R.restore_text(tables, list(R.JUMPS))


def test_rules_reference_sets_so_their_number_is_fixed() -> None:
    text = _text()
    assert "--match-set KUBE-CLUSTER-IP dst,dst -j KUBE-MARK-NONLOCAL" in text
    assert "-A KUBE-MARK-NONLOCAL -s 10.244.0.0/16 -j RETURN" in text
    assert "--match-set KUBE-LOOP-BACK dst,dst,src -j MASQUERADE" in text
    assert "-p tcp -m comment" in text and "KUBE-NODE-PORT-LOCAL-TCP dst -j RETURN" in text
    assert "--match-set KUBE-LOAD-BALANCER-SOURCE-CIDR dst,dst,src -j RETURN" in text
    assert "-m conntrack --ctstate NEW" in text and "KUBE-IPVS-IPS dst -j REJECT" in text
    assert '-I PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES' \
        in text
    chains = N.NAT_CHAINS + N.FILTER_CHAINS + N.MANGLE_CHAINS
    count = R.count_rules(text.replace("-I ", "-A "), chains)
    assert count == text.count("\n-A ") + len(R.JUMPS) < 60


def test_external_policy_local_marks_pod_traffic_and_drops_the_rest() -> None:
    text = _text()
    assert ("-A KUBE-EXTERNAL-LOCAL -s 10.244.0.0/16 -m comment" in text
            and "-j SET --map-set KUBE-EXTERNAL-LOCAL-FWMARK dst,dst --map-mark" in text)
    assert "-m mark --mark 0x0/0xffff0000" in text
    assert "--match-set KUBE-NO-LOCAL-ENDPOINTS dst,dst -j DROP" in text
    assert ("create KUBE-EXTERNAL-LOCAL-FWMARK hash:ip,port family inet hashsize 1024 "
            "maxelem 262144 skbinfo -exist") in S.full_restore({}, (4,))


def test_masquerade_all_and_no_local_detection() -> None:
    assert "KUBE-CLUSTER-IP dst,dst -j KUBE-MARK-MASQ" in _text(masquerade_all=True)
    fallback = _text(local=R.LocalDetect())
    assert "KUBE-CLUSTER-IP src,dst -j KUBE-MARK-MASQ" in fallback
    assert "-A KUBE-MARK-NONLOCAL" not in fallback
    assert "-i veth+ -j RETURN" in _text(local=R.LocalDetect(interfaces=("veth+",)))


def test_ipv6_uses_its_own_sets() -> None:
    text = _text(family=6, local=R.LocalDetect(cidrs=("fd00:244::/64",)))
    assert "KUBE-6-CLUSTER-IP" in text and "KUBE-CLUSTER-IP " not in text


def test_full_ipset_restore_swaps_complete_sets_in() -> None:
    text = S.full_restore({"KUBE-CLUSTER-IP": {"10.96.0.10,tcp:80"}}, (4,))
    lines = text.splitlines()
    tmp = N.temp_name(4, [k.base for k in S.KINDS].index(N.CLUSTER_IP))
    assert "create KUBE-CLUSTER-IP hash:ip,port family inet hashsize 1024 maxelem 262144 " \
        "-exist" in lines
    assert lines.index(f"add {tmp} 10.96.0.10,tcp:80 -exist") < lines.index(
        f"swap {tmp} KUBE-CLUSTER-IP")
    assert "create KUBE-NODE-PORT-TCP bitmap:port range 0-65535 -exist" in lines
    assert all(len(name) <= N.MAX_NAME for name in S.all_set_names())


def test_delta_restore_adds_and_deletes_entries() -> None:
    text = S.delta_restore({"KUBE-CLUSTER-IP": ["10.96.0.11,tcp:80"]},
                           {"KUBE-CLUSTER-IP": ["10.96.0.10,tcp:80"]})
    assert text == ("del KUBE-CLUSTER-IP 10.96.0.10,tcp:80 -exist\n"
                    "add KUBE-CLUSTER-IP 10.96.0.11,tcp:80 -exist\n")


def test_cleanup_removes_only_what_exists() -> None:
    text = R.cleanup_text({"nat": {"KUBE-SERVICES", "OTHER"}}, [R.JUMPS[0]])
    assert text == ("*nat\n-D PREROUTING -m comment --comment \"kubernetes service portals\" "
                    "-j KUBE-SERVICES\n:KUBE-SERVICES - [0:0]\n-X KUBE-SERVICES\nCOMMIT\n")


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_flags_become_options() -> None:
    options = cli.options_from_args(_args(
        "--ipvs-scheduler", "wlc", "--ipvs-exclude-cidrs", "10.0.0.0/8, 192.168.1.0/24",
        "--ipvs-strict-arp", "--ipvs-tcp-timeout", "15m", "--ipvs-udp-timeout", "30s"))
    assert options == IpvsOptions(scheduler="wlc",
                                  exclude_cidrs=("10.0.0.0/8", "192.168.1.0/24"),
                                  strict_arp=True, tcp_timeout=900, udp_timeout=30)
    assert options.excluded("10.1.2.3") and not options.excluded("172.16.0.1")


def test_unknown_scheduler_exits_at_start_up_naming_the_choices() -> None:
    with pytest.raises(SystemExit) as stop:
        cli.options_from_args(_args("--ipvs-scheduler", "fastest"))
    assert "unknown IPVS scheduler 'fastest'" in str(stop.value)
    assert "rr, wrr, lc" in str(stop.value)
    with pytest.raises(OptionError):
        IpvsOptions(scheduler="RR")


def test_without_ipvs_the_backend_falls_back_to_iptables(caplog) -> None:
    if not cli.ipvs_available():
        pytest.skip("this kernel has IPVS: nothing to fall back from")
    backend = cli.create(_args(), NodeConfig(node_name="n1"))
    assert backend.name != "ipvs"
    assert type(backend._inner).__module__.startswith("svcproxy.backends.iptables")
    assert backend.health_details["ipvsFallback"]["runningMode"] == backend.name
    assert "Falling back to the iptables backend" in caplog.text
