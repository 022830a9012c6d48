"""Valid Kubernetes objects and hypothesis strategies that spoil them (issue 12)."""

from __future__ import annotations

import copy
from datetime import date, datetime
from typing import Any

from hypothesis import strategies as st

Obj = dict[str, Any]


def service(name: str = "web", ns: str = "shop", ip: str = "10.96.0.10", **spec: Any) -> Obj:
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": name, "namespace": ns, "labels": {"app": name}},
            "spec": {"clusterIP": ip, "clusterIPs": [ip],
                     "ports": [{"name": "http", "port": 80, "targetPort": 8080,
                                "protocol": "TCP"}], **spec}}


def endpoint_slice(name: str = "web-1", svc: str = "web", ns: str = "shop",
                   ips: tuple[str, ...] = ("10.244.1.5",), family: str = "IPv4",
                   **extra: Any) -> Obj:
    return {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": name, "namespace": ns,
                         "labels": {"kubernetes.io/service-name": svc}},
            "addressType": family,
            "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
            "endpoints": [{"addresses": [ip], "conditions": {"ready": True},
                           "nodeName": "node-a", "zone": "zone-a"} for ip in ips],
            **extra}


def node(name: str = "node-a") -> Obj:
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"topology.kubernetes.io/zone": "zone-a"}},
            "spec": {"podCIDRs": ["10.244.1.0/24"]},
            "status": {"addresses": [{"type": "InternalIP", "address": "192.168.0.10"}]}}


def set_path(obj: Obj, path: str | tuple[Any, ...], value: Any) -> Obj:
    """A copy of ``obj`` with the value at a path set: a tuple of keys and indexes, or
    a dotted string (numbers index lists)."""
    out = copy.deepcopy(obj)
    parts = path.split(".") if isinstance(path, str) else list(path)
    *parents, last = parts
    here: Any = out
    for part in parents:
        here = here[int(part)] if isinstance(here, list) else here.setdefault(part, {})
    if isinstance(here, list):
        here[int(last)] = value
    else:
        here[last] = value
    return out


def paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path (tuple of keys and indexes) inside a JSON value."""
    out = []
    items = value.items() if isinstance(value, dict) else (
        enumerate(value) if isinstance(value, list) else [])
    for k, v in items:
        out.append((*prefix, k))
        out += paths(v, (*prefix, k))
    return out


HOSTILE_STRINGS = [
    "", " ", "HTTP", "a b", "a/b", "a;b", "a\nb", "x" * 300, "x" * 64, "-a", "a-", "a--b",
    "0.0.0.0", "127.0.0.1", "169.254.169.254", "224.0.0.1", "239.1.1.1", "255.255.255.255",
    "::", "::1", "fe80::1", "ff02::1", "fd00::1", "::ffff:10.0.0.1", "10.0.0.300",
    "fd00::1%eth0", "fd00::/64", "fd00::%1/64", "10.0.0.0/" + "9" * 5000,
    "db.example.com.", "Example.COM/x", "kubernetes.io/h2c", "SingleStack", "NoSchedule",
    "10.0.0.1/8", "10.0.0.0/99", "None", "Bogus", "Local", "Cluster", "ClientIP", "IPv4",
    "IPv6", "FQDN", "TCP", "ICMP", "udp", "no", "true", "0001-01-01T00:00:00+01:00",
    "9999-12-31T23:59:59-01:00", "\x00", "\ud800", "\u202e", "é", "${x}", "'\"{}",
    "10.96.0.10", "80", "http",
]
HOSTILE_SCALARS = st.one_of(
    st.sampled_from(HOSTILE_STRINGS), st.text(max_size=20),
    st.integers(min_value=-2**70, max_value=2**70), st.sampled_from([0, 1, 65535, 65536, 70000]),
    st.booleans(), st.none(), st.floats(allow_nan=True), st.just(b"bytes"),
    st.just(date(1, 1, 1)), st.just(datetime(9999, 12, 31)))
HOSTILE_VALUES = st.recursive(
    HOSTILE_SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=4),
                            st.dictionaries(st.sampled_from(["name", "port", "ip", "x", "a b"])
                                            | st.text(max_size=5), inner, max_size=4)),
    max_leaves=12)


@st.composite
def spoiled(draw: st.DrawFn, base: Obj) -> Obj:
    """``base`` with up to three values replaced by hostile ones."""
    obj = copy.deepcopy(base)
    for _ in range(draw(st.integers(0, 3))):
        choices = [p for p in paths(obj) if p != ("kind",)]  # the kind comes with the event
        if not choices:
            break
        obj = set_path(obj, draw(st.sampled_from(choices)), draw(HOSTILE_VALUES))
    return obj


BASES = [service(), service(ip="fd00::10", type="NodePort",
                            externalTrafficPolicy="Local", externalIPs=["192.0.2.7"]),
         endpoint_slice(), endpoint_slice(ips=("fd00::5",), family="IPv6"), node()]
ANY_OBJECT = st.sampled_from(BASES).flatmap(spoiled)
