"""Names of the nftables objects the backend owns (chains and affinity sets).

nft identifiers may hold ``[A-Za-z0-9_./-]`` and must start with a letter; the
kernel takes names of at most 255 bytes. A service port's chains are named
``<kind>-<hash>-<ns>/<name>/<proto>/<port>`` (readable, and unique thanks to the
hash); an endpoint's add ``__<ip>/<port>``. Whatever a Service is called, the
readable part is made of those characters only (each other character becomes
``_``, each part is cut to Kubernetes' length limit), so no name can break the
syntax or the kernel's limit; the hash is taken over the name as it was.
"""

from __future__ import annotations

import hashlib
import re

from svcproxy.sdk import ServicePortKey

TABLE = "svcproxy"


_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")
# What a readable name made of safe parts holds: those characters and its 3 slashes.
_UNSAFE_BUT_SLASH = re.compile(r"[^A-Za-z0-9_./-]")
# Kubernetes' limits: namespace and Service name 63 (DNS-1123/1035 labels), port name 15.
_LIMITS = (63, 63, 15)
# RFC 4648's base32 alphabet, two characters (10 bits) at a time.
_B32 = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"
_B32_PAIRS = tuple(a + b for a in _B32 for b in _B32)


def service_base(key: ServicePortKey) -> str:
    """Hash-prefixed readable base name of one service port (at most 166 characters)."""
    ns, name, port = key.namespace, key.name, key.port_name
    readable = f"{ns}/{name}/{key.protocol.lower()}/{port}"
    digest = hashlib.blake2b(readable.encode(errors="surrogatepass"), digest_size=5).digest()
    if (len(ns) > _LIMITS[0] or len(name) > _LIMITS[1] or len(port) > _LIMITS[2]
            or readable.count("/") != 3 or _UNSAFE_BUT_SLASH.search(readable)):
        ns, name, port = (_safe(text, n) for text, n in zip(
            (ns, name, port), _LIMITS, strict=True))
        readable = f"{ns}/{name}/{key.protocol.lower()}/{port}"
    return f"{_base32(digest)}-{readable}"


def _base32(digest: bytes) -> str:
    """``base64.b32encode`` of a 5-byte digest (40 bits: 8 characters, no padding)."""
    n, pairs = int.from_bytes(digest, "big"), _B32_PAIRS
    return pairs[n >> 30] + pairs[n >> 20 & 1023] + pairs[n >> 10 & 1023] + pairs[n & 1023]


def _safe(text: str, limit: int) -> str:
    """``text`` with every character nft identifiers cannot hold made ``_``, cut."""
    return _UNSAFE.sub("_", text[:limit])


def endpoint_suffix(ip: str, port: int) -> str:
    """``__<ip>/<port>`` with IPv6 colons made identifier-safe."""
    return f"__{ip.replace(':', '.')}/{port}"


def endpoint_chain(base: str, ip: str, port: int) -> str:
    return f"endpoint-{base}{endpoint_suffix(ip, port)}"


AFFINITY_PREFIX = "affinity-"


def affinity_set(base: str, ip: str, port: int, timeout: int) -> str:
    """The timeout is part of the name so that changing it creates a new set."""
    return f"{AFFINITY_PREFIX}{timeout}-{base}{endpoint_suffix(ip, port)}"


def service_chain(base: str) -> str:
    """Load-balances internal (ClusterIP) traffic over the internal endpoints."""
    return f"service-{base}"


def external_policy_chain(base: str) -> str:
    """Load-balances external traffic when its endpoints differ from the internal ones."""
    return f"external-lb-{base}"


def cluster_policy_chain(base: str) -> str:
    """All usable endpoints, for pod/node traffic short-circuited past a Local policy."""
    return f"cluster-lb-{base}"


def external_chain(base: str) -> str:
    """Entry for NodePort / ExternalIP / LoadBalancer traffic."""
    return f"external-{base}"


def firewall_chain(base: str) -> str:
    """loadBalancerSourceRanges filter."""
    return f"firewall-{base}"


def lb_chain(size: int) -> str:
    """Shared chain DNATing ClusterIP traffic of every service port with ``size`` endpoints."""
    return f"lb-{size}"


def lb_map(size: int) -> str:
    """Its map: address . protocol . port . index -> endpoint address . port."""
    return f"endpoints-{size}"
