"""The Node kind, whole: the fields svcproxy reads, the apiserver's rules for them
(pkg/apis/core/validation) with their messages, and their parse into ``objects.Node``.

No schema struct and no typed decode: Nodes are few (one per node, not one per service)
and are listed as dicts (sources/events.RAW_KINDS), so the rules and the parse, side by
side here, are the one description of the fields read.
"""

from __future__ import annotations

import ipaddress
from typing import Any

from svcproxy.frontend.edge.addresses import kube_cidr
from svcproxy.frontend.edge.checker import Checker, check_cidrs, check_object
from svcproxy.frontend.edge.limits import DEFAULT_LIMITS, ObjectLimits
from svcproxy.frontend.edge.names import QUALIFIED, is_qualified_name, matches
from svcproxy.frontend.edge.objects import (
    Node,
    as_list,
    as_mapping,
    canonical_ip,
    read_meta,
)
from svcproxy.frontend.edge.verdict import Problem, Verdict, shown
from svcproxy.frontend.edge.wellknown import TO_BE_DELETED_TAINT, ZONE_LABEL
from svcproxy.model import parse_ip

NODE_ADDRESS_TYPES = ("Hostname", "InternalIP", "ExternalIP", "InternalDNS", "ExternalDNS")
TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")


def validate_node(obj: Any, limits: ObjectLimits = DEFAULT_LIMITS) -> Verdict:
    """A Node's fields svcproxy reads, with the apiserver's rules."""
    c = Checker(limits)
    if not check_object(c, obj, limits):
        return c.v
    c.metadata(obj, c.subdomain, namespaced=False)  # ValidateObjectMeta, ValidateNodeName
    spec = c.mapping(obj.get("spec"), "spec")
    # ValidateNode: each podCIDR ValidateCIDR, at most one of each family.
    cidrs = c.items(spec.get("podCIDRs"), "spec.podCIDRs", limit=2)
    families = [f for i, cidr in enumerate(cidrs)
                for f in check_cidrs(c, cidr, f"spec.podCIDRs[{i}]")]
    if len(families) == 2 and families[0] == families[1]:
        c.err("spec.podCIDRs", "ip_family", "may hold one CIDR of each IP family")
    if spec.get("podCIDR") not in (None, "") and not cidrs:  # converted to podCIDRs[0]
        check_cidrs(c, spec.get("podCIDR"), "spec.podCIDR")  # only when podCIDRs is unset
    _taints(c, spec.get("taints"))
    status = c.mapping(obj.get("status"), "status")
    for i, raw in enumerate(c.items(status.get("addresses"), "status.addresses")):
        where = f"status.addresses[{i}]"
        addr = c.mapping(raw, where)
        kind = c.string(addr.get("type"), f"{where}.type")
        text = addr.get("address")
        if not isinstance(text, str):
            c.err(f"{where}.address", "malformed", "must be a string")
        elif kind and kind not in NODE_ADDRESS_TYPES:  # Kubernetes validates no status
            c.v.warnings.append(Problem(f"{where}.type", "ignored_value", f"{shown(kind)} "
                                        "is not a node address type; ignored"))
        elif kind in ("InternalIP", "ExternalIP") and parse_ip(text) is None:
            c.v.warnings.append(Problem(f"{where}.address", "ignored_value",
                                        f"{shown(text)} is not an IP address; ignored"))
    return c.v


def _taints(c: Checker, value: Any) -> None:
    """validateNodeTaints: a qualified-name key, a label value, an effect, each key and
    effect once (svcproxy reads the keys only)."""
    seen: set[tuple[str, str]] = set()
    for i, raw in enumerate(c.items(value, "spec.taints")):
        where = f"spec.taints[{i}]"
        taint = c.mapping(raw, where)
        key = c.string(taint.get("key"), f"{where}.key", required=True)
        if key and not is_qualified_name(key):
            c.err(f"{where}.key", "invalid_name", f"{shown(key)} is not a qualified name")
        text = c.string(taint.get("value"), f"{where}.value")
        if text and (len(text) > 63 or not matches(QUALIFIED, text)):
            c.err(f"{where}.value", "invalid_value", f"{shown(text)} is not a label value")
        effect = taint.get("effect")
        if effect not in TAINT_EFFECTS:
            c.err(f"{where}.effect", "invalid_value", f"{shown(effect)} is not one of "
                  f"{', '.join(TAINT_EFFECTS)}")
        elif (key, effect) in seen:
            c.err(where, "duplicate", f"{shown(key)} {effect} is listed twice")
        else:
            seen.add((key, effect))


def parse_node(obj: dict[str, Any]) -> Node:
    """A Node from its JSON; raises ParseError."""
    _, name, meta = read_meta(obj, namespaced=False)
    labels = {str(k): str(v) for k, v in as_mapping(meta.get("labels"), "metadata.labels").items()}
    spec = as_mapping(obj.get("spec"), "spec")
    status = as_mapping(obj.get("status"), "status")
    cidrs = as_list(spec.get("podCIDRs"), "spec.podCIDRs") or (
        [spec["podCIDR"]] if spec.get("podCIDR") else [])
    pod_cidrs = tuple(c for c in (kube_cidr(str(x)) for x in cidrs) if c)
    addresses = tuple(dict.fromkeys(
        ip for a in as_list(status.get("addresses"), "status.addresses")
        if as_mapping(a, "status.addresses").get("type") in ("InternalIP", "ExternalIP")
        and (ip := _node_ip(str(a.get("address", "")))) is not None))
    taints = as_list(spec.get("taints"), "spec.taints")
    terminating = bool(meta.get("deletionTimestamp")) or any(
        as_mapping(t, "spec.taints").get("key") == TO_BE_DELETED_TAINT for t in taints)
    return Node(name, labels.get(ZONE_LABEL, ""), tuple(sorted(labels.items())), pod_cidrs,
                addresses, terminating)


def _node_ip(text: str) -> str | None:
    """A Node status address as kube-proxy reads it (netutils.ParseIPSloppy, then IPv4 if it
    is one): not with spaces around it, an IPv4-mapped IPv6 address as its IPv4 address.
    Kubernetes validates no Node status, so such addresses reach us."""
    if text != text.strip():
        return None
    ip = canonical_ip(text)
    if ip is not None and ip.startswith("::ffff:"):
        mapped = ipaddress.IPv6Address(ip).ipv4_mapped
        return str(mapped) if mapped is not None else ip
    return ip
