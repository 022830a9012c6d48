"""The Node kind, whole: the apiserver's rules for the fields svcproxy reads
(pkg/apis/core/validation) with their messages, each rule giving the value it checked to
the ``objects.Node`` it builds (``read_node``; ``validate_node`` is that pass's verdict).

One reader, and no schema struct or typed decode: Nodes are few (one per node, not one
per service) and are listed as dicts (sources/events.RAW_KINDS). A new field goes in one
place: the rule that reads it, here.
"""

from __future__ import annotations

import ipaddress
from typing import Any

from svcproxy.frontend.edge.addresses import kube_cidr
from svcproxy.frontend.edge.checker import Checker, check_cidrs, check_object
from svcproxy.frontend.edge.limits import DEFAULT_LIMITS, ObjectLimits
from svcproxy.frontend.edge.names import QUALIFIED, is_qualified_name, matches
from svcproxy.frontend.edge.objects import Node, canonical_ip
from svcproxy.frontend.edge.verdict import Problem, Verdict, shown
from svcproxy.frontend.edge.wellknown import TO_BE_DELETED_TAINT, ZONE_LABEL
from svcproxy.model import parse_ip

NODE_ADDRESS_TYPES = ("Hostname", "InternalIP", "ExternalIP", "InternalDNS", "ExternalDNS")
TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")


def read_node(obj: Any, limits: ObjectLimits = DEFAULT_LIMITS) -> tuple[Node | None, Verdict]:
    """A Node read in one pass: each field svcproxy reads checked once as the apiserver
    validates it (its problems, with their messages, in the verdict) and taken as the
    value the Node is made of; the Node is None when the verdict refuses it."""
    c = Checker(limits)
    if not check_object(c, obj, limits):
        return None, c.v
    # ValidateObjectMeta, ValidateNodeName.
    labels, _ = c.metadata(obj, c.subdomain, namespaced=False)
    spec = c.mapping(obj.get("spec"), "spec")
    pod_cidrs = _pod_cidrs(c, spec)
    deleting = _taints(c, spec.get("taints"))
    addresses = _addresses(c, c.mapping(obj.get("status"), "status"))
    if not c.v.ok:
        return None, c.v
    meta = obj["metadata"]
    return Node(meta["name"], labels.get(ZONE_LABEL, ""), tuple(sorted(labels.items())),
                pod_cidrs, addresses, bool(meta.get("deletionTimestamp")) or deleting), c.v


def validate_node(obj: Any, limits: ObjectLimits = DEFAULT_LIMITS) -> Verdict:
    """A Node's fields svcproxy reads, with the apiserver's rules (``read_node``'s
    verdict)."""
    return read_node(obj, limits)[1]


def _pod_cidrs(c: Checker, spec: dict[str, Any]) -> tuple[str, ...]:
    """ValidateNode: each podCIDR ValidateCIDR, at most one of each family; podCIDR, only
    when podCIDRs is unset (it is converted to podCIDRs[0]). The ranges read, as Go reads
    them (``kube_cidr``)."""
    cidrs = c.items(spec.get("podCIDRs"), "spec.podCIDRs", limit=2)
    families = [f for i, cidr in enumerate(cidrs)
                for f in check_cidrs(c, cidr, f"spec.podCIDRs[{i}]")]
    if len(families) == 2 and families[0] == families[1]:
        c.err("spec.podCIDRs", "ip_family", "may hold one CIDR of each IP family")
    if spec.get("podCIDR") not in (None, "") and not cidrs:
        if check_cidrs(c, spec.get("podCIDR"), "spec.podCIDR"):
            cidrs = [spec["podCIDR"]]
    if not c.v.ok:
        return ()
    return tuple(cidr for cidr in map(kube_cidr, cidrs) if cidr)


def _addresses(c: Checker, status: dict[str, Any]) -> tuple[str, ...]:
    """The status addresses, which Kubernetes does not validate: an address of a type it
    does not know, or an InternalIP/ExternalIP that is no IP, is ignored with a warning.
    The InternalIP and ExternalIP addresses read as kube-proxy reads them (``_node_ip``),
    without repeats."""
    out = []
    for i, raw in enumerate(c.items(status.get("addresses"), "status.addresses")):
        where = f"status.addresses[{i}]"
        addr = c.mapping(raw, where)
        kind = c.string(addr.get("type"), f"{where}.type")
        text = addr.get("address")
        if not isinstance(text, str):
            c.err(f"{where}.address", "malformed", "must be a string")
            continue
        if kind and kind not in NODE_ADDRESS_TYPES:
            c.v.warnings.append(Problem(f"{where}.type", "ignored_value", f"{shown(kind)} "
                                        "is not a node address type; ignored"))
        elif kind in ("InternalIP", "ExternalIP") and parse_ip(text) is None:
            c.v.warnings.append(Problem(f"{where}.address", "ignored_value",
                                        f"{shown(text)} is not an IP address; ignored"))
        if kind in ("InternalIP", "ExternalIP") and (ip := _node_ip(text)) is not None:
            out.append(ip)
    return tuple(dict.fromkeys(out))


def _taints(c: Checker, value: Any) -> bool:
    """validateNodeTaints: a qualified-name key, a label value, an effect, each key and
    effect once; whether one is ToBeDeletedByClusterAutoscaler (svcproxy reads the keys
    only: such a node is terminating)."""
    seen: set[tuple[str, str]] = set()
    deleting = False
    for i, raw in enumerate(c.items(value, "spec.taints")):
        where = f"spec.taints[{i}]"
        taint = c.mapping(raw, where)
        key = c.string(taint.get("key"), f"{where}.key", required=True)
        deleting = deleting or key == TO_BE_DELETED_TAINT
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
    return deleting


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
