"""svcproxy.sdk.rtnetlink against pyroute2's reading of the same network namespace (one
this test creates: several addresses per family, a deprecated one, default routes with a
preferred source and metrics)."""

from __future__ import annotations

import json
import os
import shutil
import sys

import pytest

from tests.support.lab.netns import ip, ns_exec
from tests.support.lab.topology import Namespaces, addresses, veth

# Run inside the namespace: both readings, as JSON.
READ = """
import json, socket
from pyroute2 import IPRoute
from svcproxy.sdk import rtnetlink
from svcproxy.sdk.context import interface_addresses
with IPRoute() as ipr:
    ref_addrs = sorted([m["family"], m["index"], m.get("IFA_ADDRESS"), m["scope"],
                        m.get("IFA_FLAGS") or m["flags"]]
                       for m in ipr.get_addr() if m.get("IFA_ADDRESS"))
    ref_routes = sorted([f, m.get("RTA_OIF") or 0, m.get("RTA_PREFSRC") or "",
                         m.get("RTA_PRIORITY") or 0]
                        for f in (socket.AF_INET, socket.AF_INET6)
                        for m in ipr.get_default_routes(family=f))
ours_addrs = sorted([a.family, a.index, a.address, a.scope, a.flags]
                    for a in rtnetlink.addresses())
ours_routes = sorted([r.family, r.oif, r.prefsrc, r.priority]
                     for f in (socket.AF_INET, socket.AF_INET6)
                     for r in rtnetlink.default_routes(f))
print(json.dumps([ref_addrs, ours_addrs, ref_routes, ours_routes,
                  interface_addresses(("DEV",)), rtnetlink.interface_index("nosuch0")]))
"""


@pytest.mark.netns
def test_addresses_and_default_routes_match_pyroute2() -> None:
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("needs root and iproute2")
    dev, other = "r0", "o0"
    namespaces = Namespaces()
    try:
        ns = namespaces.add_ns("rtnl")
        for name in (dev, other):
            veth(ns, name, ns, f"p{name}")
        addresses(ns, dev, "10.60.0.5/24", "10.60.0.9/24", "fd60::5/64")
        ip(ns, "addr", "add", "10.61.0.1/24", "dev", other, "preferred_lft", "0")
        addresses(ns, other, "fd61::5/64")
        ip(ns, "route", "add", "default", "dev", dev, "src", "10.60.0.9", "metric", "5")
        ip(ns, "route", "add", "default", "dev", other, "metric", "7")
        ip(ns, "-6", "route", "add", "default", "dev", dev, "metric", "300")
        out = ns_exec(ns, sys.executable, "-c", READ.replace("DEV", other), timeout=60)
    finally:
        namespaces.destroy()
    ref_addrs, ours_addrs, ref_routes, ours_routes, without_other, missing = json.loads(out)
    assert ours_addrs == ref_addrs and len(ours_addrs) >= 7
    assert ours_routes == ref_routes and len(ours_routes) == 3
    assert ["10.60.0.9", 5] in [[r[2], r[3]] for r in ours_routes]
    assert "10.60.0.5" in without_other and "10.61.0.1" not in without_other
    assert "fd61::5" not in without_other and "127.0.0.1" in without_other
    assert missing is None
