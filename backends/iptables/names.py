"""Chain names and rule comments, spelled exactly as kube-proxy's iptables mode spells them.

Chain names are "KUBE-XXX-" plus 16 characters of base32(sha256(...)), so a
service port gets the same KUBE-SVC-* chain here as under kube-proxy.
"""

from __future__ import annotations

import hashlib
import re
from functools import lru_cache

from svcproxy.sdk import Endpoint, ServicePortKey

SERVICES = "KUBE-SERVICES"
EXTERNAL_SERVICES = "KUBE-EXTERNAL-SERVICES"
NODEPORTS = "KUBE-NODEPORTS"
POSTROUTING = "KUBE-POSTROUTING"
MARK_MASQ = "KUBE-MARK-MASQ"
FORWARD = "KUBE-FORWARD"
PROXY_FIREWALL = "KUBE-PROXY-FIREWALL"
KUBELET_FIREWALL = "KUBE-FIREWALL"
CANARY = "KUBE-PROXY-CANARY"

SVC_PREFIX = "KUBE-SVC-"
SVL_PREFIX = "KUBE-SVL-"
FW_PREFIX = "KUBE-FW-"
EXT_PREFIX = "KUBE-EXT-"
SEP_PREFIX = "KUBE-SEP-"
SERVICE_CHAIN_PREFIXES = (SVC_PREFIX, SVL_PREFIX, FW_PREFIX, EXT_PREFIX, SEP_PREFIX)


def port_name(key: ServicePortKey) -> str:
    """kube-proxy's ServicePortName string: "ns/name" or "ns/name:port"."""
    base = f"{key.namespace}/{key.name}"
    return f"{base}:{key.port_name}" if key.port_name else base


_BASE32 = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"
_PAIRS = [a + b for a in _BASE32 for b in _BASE32]  # 10 bits -> two base32 characters
_SHIFTS = tuple(range(70, -1, -10))


def _hash16(text: str) -> str:
    """The first 16 base32 characters of sha256(text): its first 80 bits."""
    bits = int.from_bytes(
        hashlib.sha256(text.encode(errors="surrogatepass")).digest()[:10], "big")
    return "".join([_PAIRS[(bits >> shift) & 1023] for shift in _SHIFTS])


@lru_cache(maxsize=65536)
def service_hash(key: ServicePortKey) -> str:
    """The 16-character hash shared by a service port's SVC/SVL/EXT/FW chains."""
    return _hash16(port_name(key) + key.protocol.value.lower())


def endpoint_string(endpoint: Endpoint) -> str:
    """ip:port, with IPv6 addresses in brackets (as Go's net.JoinHostPort)."""
    host = f"[{endpoint.ip}]" if ":" in endpoint.ip else endpoint.ip
    return f"{host}:{endpoint.port}"


def endpoint_chain(key: ServicePortKey, endpoint: Endpoint) -> str:
    """KUBE-SEP-* chain of one endpoint of one service port."""
    return endpoint_chain_of(port_name(key) + key.protocol.value.lower(), endpoint)


def endpoint_chain_of(service_text: str, endpoint: Endpoint) -> str:
    """KUBE-SEP-* chain from the service's name+protocol text (computed once per service)."""
    return SEP_PREFIX + _hash16(service_text + endpoint_string(endpoint))


def is_service_chain(chain: str) -> bool:
    """True for the per-service chains this backend creates and deletes."""
    return chain.startswith(SERVICE_CHAIN_PREFIXES)


_COMMENT_UNSAFE = re.compile(r"[^A-Za-z0-9 _.,:/>()\[\]=+@-]")
MAX_COMMENT = 255  # bytes: the kernel's XT_MAX_COMMENT_LEN with its NUL


def quote(comment: str) -> str:
    """A comment as iptables-restore reads it: quoted when it holds a space.

    Whatever the Service is called, the comment holds only characters that need no
    escaping (each other one becomes ``_``: a quote, a backslash, a newline, non-ASCII)
    and fits the kernel's limit, so no name can break the restore input's syntax.
    Valid Kubernetes names are kept as they are.
    """
    safe = _COMMENT_UNSAFE.sub("_", comment[:MAX_COMMENT]) or "_"
    return f'"{safe}"' if " " in safe else safe
