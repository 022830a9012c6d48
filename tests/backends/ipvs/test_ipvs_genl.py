"""The IPVS netlink messages we batch are the ones pyroute2 (and the kernel) expect."""

from __future__ import annotations

import socket

import pytest
from pyroute2 import IPVSDest, IPVSService
from pyroute2.netlink.generic import ipvs as pr

from svcproxy.backends.ipvs import genl


def _pyroute2_attrs(service: IPVSService, dest: IPVSDest | None = None) -> dict[str, object]:
    """Encode with pyroute2, decode again: attribute name -> value (order-free)."""
    msg = pr.ipvsmsg()
    msg["cmd"] = genl.CMD_NEW_DEST if dest is not None else genl.CMD_NEW_SERVICE
    msg["version"] = 1
    msg["attrs"] = [("IPVS_CMD_ATTR_SERVICE", service.dump_nla())]
    if dest is not None:
        msg["attrs"].append(("IPVS_CMD_ATTR_DEST", dest.dump_nla()))
    msg.encode()
    return _decode(bytes(msg.data))


def _decode(data: bytes) -> dict[str, object]:
    msg = pr.ipvsmsg(data)
    msg.decode()
    result: dict[str, object] = {}
    for _name, value in msg["attrs"]:
        for key, inner in value["attrs"]:
            result[key] = inner
    return result


def _ours(cmd_attrs: tuple[int, bytes]) -> dict[str, object]:
    cmd, attrs = cmd_attrs
    return _decode(genl.message(0, cmd, attrs, 1))


@pytest.mark.parametrize("address", ["10.96.0.10", "fd00:96::10"])
def test_service_matches_pyroute2(address: str) -> None:
    spec = genl.ServiceSpec(genl.ServiceId("TCP", address, 443), "sh", 10800)
    flags = {"flags": genl.FLAG_PERSISTENT, "mask": 0xFFFF}
    theirs = IPVSService(addr=address, port=443, protocol=socket.IPPROTO_TCP, sched_name="sh",
                         timeout=10800, flags=flags)
    ours = _ours(genl.add_service(spec))
    expected = _pyroute2_attrs(theirs)
    for key in ("IPVS_SVC_ATTR_AF", "IPVS_SVC_ATTR_PROTOCOL", "IPVS_SVC_ATTR_ADDR",
                "IPVS_SVC_ATTR_PORT", "IPVS_SVC_ATTR_SCHED_NAME", "IPVS_SVC_ATTR_FLAGS",
                "IPVS_SVC_ATTR_TIMEOUT"):
        assert ours[key] == expected[key], key


@pytest.mark.parametrize("address", ["10.244.1.2", "fd00:244::2"])
def test_nat_real_server_matches_pyroute2_with_masquerading(address: str) -> None:
    sid = genl.ServiceId("UDP", "10.96.0.10" if "." in address else "fd00::1", 53)
    ours = _ours(genl.add_dest(sid, genl.DestId(address, 5353), 1))
    theirs = _pyroute2_attrs(
        IPVSService(addr=sid.address, port=53, protocol=socket.IPPROTO_UDP),
        IPVSDest(addr=address, port=5353, fwd_method=0, weight=1),
    )
    for key in ("IPVS_DEST_ATTR_ADDR", "IPVS_DEST_ATTR_PORT", "IPVS_DEST_ATTR_WEIGHT",
                "IPVS_DEST_ATTR_ADDR_FAMILY", "IPVS_DEST_ATTR_U_THRESH"):
        assert ours[key] == theirs[key], key
    assert ours["IPVS_DEST_ATTR_FWD_METHOD"] == 0, "NAT (masquerading), not direct routing"


def test_parsing_reads_back_what_was_encoded() -> None:
    spec = genl.ServiceSpec(genl.ServiceId("SCTP", "10.96.0.9", 3868), "mh", 60)
    payload = genl.genl_body(*genl.add_service(spec))
    assert genl.parse_service(payload) == spec
    _cmd, attrs = genl.set_dest(spec.id, genl.DestId("10.244.0.7", 3869), 0)
    parsed = genl.parse_dest(genl.genl_body(_cmd, attrs), socket.AF_INET)
    assert (parsed.id, parsed.weight, parsed.fwd_method) == (
        genl.DestId("10.244.0.7", 3869), 0, genl.FWD_MASQ)


def test_firewall_mark_services_round_trip() -> None:
    spec = genl.ServiceSpec(genl.fwmark_service(6, 0x30000), "rr", 10800)
    assert genl.parse_service(genl.genl_body(*genl.add_service(spec))) == spec
    assert str(spec.id) == "FWMARK/0x30000/ipv6"
