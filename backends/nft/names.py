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

import base64
import hashlib
import re

from svcproxy.sdk import ServicePortKey

TABLE = "svcproxy"


_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")
# Kubernetes' limits: namespace and Service name 63 (DNS-1123/1035 labels), port name 15.
_LIMITS = (63, 63, 15)


def service_base(key: ServicePortKey) -> str:
    """Hash-prefixed readable base name of one service port (at most 166 characters)."""
    readable = f"{key.namespace}/{key.name}/{key.protocol.value.lower()}/{key.port_name}"
    digest = hashlib.blake2b(readable.encode(errors="surrogatepass"), digest_size=5).digest()
    ns, name, port = (_safe(text, n) for text, n in zip(
        (key.namespace, key.name, key.port_name), _LIMITS, strict=True))
    safe = f"{ns}/{name}/{key.protocol.value.lower()}/{port}"
    return f"{base64.b32encode(digest).decode()}-{safe}"


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
