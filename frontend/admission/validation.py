"""Requests checked at the edge: a bad one is refused alone with INVALID_ARGUMENT."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TypeVar

from google.protobuf.message import DecodeError, Message

from svcproxy.frontend.admission.refusals import INVALID, Refused
from svcproxy.frontend.edge.names import DNS1035_LABEL, DNS1123_LABEL
from svcproxy.frontend.edge.verdict import shown

M = TypeVar("M", bound=Message)

# A Kubernetes node name is a DNS-1123 subdomain.
_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
MAX_NODE_NAME = 253
MAX_LABEL = 63


def invalid(method: str, message: str) -> Refused:
    INVALID.labels(method).inc()
    return Refused("INVALID_ARGUMENT", message)


@dataclass(frozen=True, slots=True)
class Malformed:
    """A request that is not the method's message: its handler refuses it (gRPC would
    answer UNKNOWN and log a traceback per call)."""

    message: str


def parse(kind: type[M], data: bytes) -> M | Malformed:
    """``data`` as a ``kind``, or why it is not one."""
    try:
        return kind.FromString(data)
    except DecodeError as err:
        name = kind.DESCRIPTOR.full_name
        return Malformed(f"the request is not a serialised {name} ({err}); send that "
                         f"message (`grpcurl describe {name}` shows its fields)")


def check_node_name(method: str, name: str) -> None:
    """Refuse a node name that no Kubernetes Node can have."""
    if not name:
        hint = ("use WatchCluster for every node" if method == "Watch"
                else "use ListNodes for the nodes, WatchCluster for every service")
        raise invalid(method, f"node_name is required ({hint})")
    if len(name) > MAX_NODE_NAME or not _SUBDOMAIN.fullmatch(name):
        raise invalid(method, (
            f"node_name {shown(name)} is not a Kubernetes node name: a DNS-1123 subdomain of at "
            f"most {MAX_NODE_NAME} characters (lowercase letters, digits, '-' and '.', "
            "starting and ending with a letter or digit)"))


def check_filters(method: str, namespace: str, service: str) -> None:
    """Refuse a namespace or Service filter that no object can match (a typo would
    otherwise look like an empty namespace)."""
    if namespace and (len(namespace) > MAX_LABEL or not DNS1123_LABEL.fullmatch(namespace)):
        raise invalid(method, (
            f"namespace {shown(namespace)} is not a Kubernetes namespace name: a DNS-1123 "
            f"label of at most {MAX_LABEL} characters (lowercase letters, digits and '-', "
            "starting and ending with a letter or digit); leave it empty for every "
            "namespace"))
    if service and (len(service) > MAX_LABEL or not DNS1035_LABEL.fullmatch(service)):
        raise invalid(method, (
            f"service {shown(service)} is not a Kubernetes Service name: a DNS-1035 label "
            f"of at most {MAX_LABEL} characters (lowercase letters, digits and '-', "
            "starting with a letter and ending with a letter or digit); leave it empty for "
            "every Service"))


def check_since(method: str, since: int, revision: int) -> None:
    """Refuse a resume from a revision this frontend has not reached yet."""
    if since > revision:
        raise invalid(method, (
            f"since_revision {since} is ahead of this frontend's revision {revision}: it "
            "was not handed out here; resume with the svcproxy-epoch metadata the stream "
            "announced (then another replica's revision becomes a reset), or watch from "
            "since_revision 0 for a full snapshot"))
