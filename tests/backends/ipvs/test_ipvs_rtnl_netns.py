"""The batched rtnetlink requests and raw dumps against the real kernel (host, netns)."""

from __future__ import annotations

import socket
import subprocess
from collections.abc import Iterator

import pytest

from svcproxy.backends.ipvs import rtnl
from svcproxy.backends.ipvs.netlink import NETLINK_ROUTE, NetlinkBatch, Request
from tests.support.lab.netns import call_in
from tests.support.netns.harness import netns_or_skip

pytestmark = pytest.mark.netns


@pytest.fixture
def ns() -> Iterator[str]:
    with netns_or_skip("ivr") as name:
        subprocess.run(["ip", "-n", name, "link", "add", "v0", "type", "veth", "peer", "name",
                        "v1"], check=True)
        yield name


def _program(addresses: list[str], routes: list[str]) -> tuple[set[str], set[str]]:
    sock = NetlinkBatch(NETLINK_ROUTE)
    try:
        index = socket.if_nametoindex("v0")
        requests = [Request(f"bind {a}", rtnl.address_body(a, index), rtnl.RTM_NEWADDR,
                            rtnl.ADD_FLAGS) for a in addresses]
        requests += [Request(f"route {r}", rtnl.local_route_body(r, index), rtnl.RTM_NEWROUTE,
                             rtnl.ADD_FLAGS) for r in routes]
        assert sock.apply(requests) == []
        bound = {a for i, a in map(rtnl.parse_address,
                                   sock.dump(rtnl.RTM_GETADDR, rtnl.dump_addresses_body()))
                 if i == index}
        local = set()
        for family in (2, 10):
            for payload in sock.dump(rtnl.RTM_GETROUTE, rtnl.dump_routes_body(family)):
                route = rtnl.parse_local_route(payload)
                if route is not None and route[0] == index:
                    local.add(route[1])
        return bound, local
    finally:
        sock.close()


def test_batched_addresses_and_local_routes_are_read_back(ns: str) -> None:
    addresses = [f"10.96.{i // 250}.{i % 250 + 1}" for i in range(600)] + ["fd00:96::1"]
    bound, local = call_in(ns, _program, addresses, ["198.51.100.7"])
    assert bound == set(addresses)
    assert "198.51.100.7" in local and set(addresses[:600]) <= local
    out = subprocess.run(["ip", "-n", ns, "-4", "addr", "show", "dev", "v0"],
                         capture_output=True, text=True, check=True).stdout
    assert "10.96.2.100/32" in out
