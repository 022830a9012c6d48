"""Who may wait for the fleet (WaitFleet): cluster readers for anything; a pod, by its own
projected ServiceAccount token, only for its own addresses.

A pod-bound token names its pod (TokenReview's pod-name and pod-uid extras); the pod's
addresses are read from the pod object (``status.podIPs``) and the uid checked, so a token
of a deleted pod, or of another pod of the same name, waits for nothing. A pod may ask
whether its own address is gone or ready, never about a Service.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Awaitable, Callable

from svcproxy.frontend.serving.access.auth import Identity
from svcproxy.v1 import nodestate_pb2 as pb

# (namespace, name, uid) -> the pod's IPs (raises Unauthenticated-like LookupError).
PodAddresses = Callable[[str, str, str], Awaitable[frozenset[str]]]


def asked_address(request: pb.WaitFleetRequest) -> str | None:
    """The IP an endpoint wait asks about (None: a Service wait, or no valid address)."""
    text = request.endpoint_gone or request.endpoint_ready
    if not text:
        return None
    host = text
    if text.startswith("["):
        host = text[1:].partition("]")[0]
    elif text.count(":") == 1:
        host = text.partition(":")[0]
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        return None


async def wait_refusal(identity: Identity, request: pb.WaitFleetRequest,
                       addresses: PodAddresses | None) -> str | None:
    """None if ``identity`` (not a cluster reader) may make this wait, else why not."""
    if not identity.pod or addresses is None:
        return (f"{identity.describe()} may not call WaitFleet: a pod may wait only for its "
                "own addresses, with its own pod-bound ServiceAccount token; anything else "
                "is for identities named in --cluster-readers")
    namespace, _, name = identity.pod.partition("/")
    ip = asked_address(request)
    if ip is None:
        return (f"pod {identity.pod} may wait only for its own addresses "
                "(endpoint_gone or endpoint_ready), not for a Service")
    try:
        own = await addresses(namespace, name, identity.pod_uid)
    except LookupError as err:
        return f"pod {identity.pod}'s addresses cannot be read: {err}"
    if ip not in own:
        return (f"pod {identity.pod} may wait only for its own addresses "
                f"({', '.join(sorted(own)) or 'none yet'}), not {ip}")
    return None
