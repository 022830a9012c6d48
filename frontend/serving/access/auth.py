"""Who is calling: identities from client certificates, ServiceAccount tokens or nobody.

Kubernetes components' conventions: a client certificate signed by the configured CA
with ``CN=system:node:NAME`` and ``O=system:nodes`` is node NAME (as kubelet's are);
any other certificate is the identity CN with its O values as groups. A bearer token
is checked with the apiserver's TokenReview (tokenreview.py); the token of a pod whose
ServiceAccount is one of the agents' (``--node-service-accounts``) is bound to the node
of that pod, any other pod's token only to its pod (WaitFleet for its own addresses).
Without any authentication configured, callers are
anonymous, which the frontend only accepts on a unix socket or loopback (or with
``--insecure-allow-anonymous``): see ``check_listen``.
"""

from __future__ import annotations

import functools
import ipaddress
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

NODE_PREFIX = "system:node:"
NODES_GROUP = "system:nodes"
ANONYMOUS = "system:anonymous"
SERVICE_ACCOUNT_PREFIX = "system:serviceaccount:"
# The agents' ServiceAccounts in deploy/: svcproxy's DaemonSets and kubeadm's kube-proxy.
DEFAULT_NODE_SERVICE_ACCOUNTS = "svcproxy:svcproxy-backend,kube-system:kube-proxy"


@dataclass(frozen=True, slots=True)
class Identity:
    """An authenticated caller; ``node`` is set for a node identity."""

    name: str
    groups: frozenset[str] = frozenset()
    node: str | None = None
    via: str = "x509"
    # A pod-bound token's pod ("namespace/name") and its uid (for WaitFleet).
    pod: str = ""
    pod_uid: str = ""

    def describe(self) -> str:
        what = f"node {self.node}" if self.node else "identity"
        return f"{what} {self.name!r} (by {self.via})"


ANONYMOUS_IDENTITY = Identity(ANONYMOUS, frozenset({"system:unauthenticated"}), via="anonymous")


class Unauthenticated(Exception):
    """The caller could not be authenticated; the message says why."""


@functools.lru_cache(maxsize=4096)
def identity_from_cert(pem: bytes) -> Identity:
    """The identity a verified client certificate names (kubelet's node convention);
    remembered per certificate, as a node makes many calls with one."""
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    subject = x509.load_pem_x509_certificate(pem).subject
    cns = subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    cn = str(cns[0].value) if cns else ""
    groups = frozenset(str(a.value) for a in
                       subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME))
    if not cn:
        raise Unauthenticated("the client certificate has no common name")
    node = cn.removeprefix(NODE_PREFIX) if (
        cn.startswith(NODE_PREFIX) and NODES_GROUP in groups) else None
    return Identity(cn, groups, node or None, "x509")


@dataclass(frozen=True, slots=True)
class AuthConfig:
    """How callers are authenticated and who reads everything (picklable: stream workers
    build their own authenticator from it)."""

    client_certs: bool = False
    token_audience: str | None = None
    token_kubeconfig: str | None = None
    token_cache_ttl: float = 10.0
    cluster_readers: frozenset[str] = field(default_factory=frozenset)
    # User names of the ServiceAccounts whose pods' tokens are node identities.
    node_service_accounts: frozenset[str] = field(
        default_factory=lambda: parse_node_service_accounts(DEFAULT_NODE_SERVICE_ACCOUNTS))
    # Only while nothing is configured (see check_listen).
    allow_anonymous: bool = True

    @property
    def tokens(self) -> bool:
        return self.token_audience is not None

    @property
    def configured(self) -> bool:
        return self.client_certs or self.tokens


def parse_node_service_accounts(text: str) -> frozenset[str]:
    """``--node-service-accounts``: comma-separated NAMESPACE:NAME (as ``kubectl create
    rolebinding --serviceaccount`` takes them), as the user names their tokens carry
    (``system:serviceaccount:NAMESPACE:NAME``); ValueError saying what is wrong."""
    from svcproxy.frontend.edge.names import DNS1123_LABEL, DNS1123_SUBDOMAIN

    names = set()
    for item in filter(None, (part.strip() for part in text.split(","))):
        namespace, colon, name = item.partition(":")
        if not colon or len(namespace) > 63 or not DNS1123_LABEL.fullmatch(namespace) or \
                len(name) > 253 or not DNS1123_SUBDOMAIN.fullmatch(name):
            raise ValueError(
                f"--node-service-accounts: {item!r} is not NAMESPACE:NAME (a namespace, a "
                "DNS-1123 label, and a ServiceAccount name, a DNS-1123 subdomain), e.g. "
                "svcproxy:svcproxy-backend")
        names.add(f"{SERVICE_ACCOUNT_PREFIX}{namespace}:{name}")
    return frozenset(names)


def is_local(listen: str) -> bool:
    """Whether ``listen`` is a unix socket or a loopback address."""
    if listen.startswith("unix:"):
        return True
    host = listen.rpartition(":")[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_listen(listen: str, tls: bool, client_certs: bool, tokens: bool,
                 insecure_allow_anonymous: bool) -> bool:
    """Whether anonymous callers are accepted; raises ValueError (saying what to do) for
    a configuration that would serve every node's state to anyone who reaches it."""
    if client_certs and tokens:
        raise ValueError("--tls-client-ca and --token-audience cannot share one port: gRPC "
                         "Python cannot ask for a client certificate without requiring one; "
                         "choose certificates or ServiceAccount tokens")
    if tokens and not tls and not is_local(listen):
        raise ValueError(f"bearer tokens would cross the network in plaintext on {listen}: "
                         "give --tls-cert and --tls-key")
    if client_certs or tokens:
        return False
    if insecure_allow_anonymous or is_local(listen):
        return True
    raise ValueError(f"anyone who reaches {listen} could read every node's state: "
                     "authenticate callers (--tls-client-ca for node certificates, or "
                     "--token-audience for ServiceAccount tokens), listen on loopback or a "
                     "unix socket, or pass --insecure-allow-anonymous")


TokenCheck = Callable[[str], Awaitable[Identity]]


class Authenticator:
    """Finds the identity of a call from its auth context and metadata."""

    def __init__(self, config: AuthConfig, tokens: TokenCheck | None = None) -> None:
        self.config = config
        self.tokens = tokens

    async def authenticate(self, auth_context: dict[str, Sequence[bytes]],
                           metadata: Sequence[tuple[str, str | bytes]]) -> Identity:
        """The caller's identity; raises Unauthenticated with the reason."""
        token = bearer_token(metadata)
        if token is not None:
            if self.tokens is None:
                raise Unauthenticated("this frontend does not accept bearer tokens "
                                      "(no --token-audience)")
            return await self.tokens(token)
        pem = auth_context.get("x509_pem_cert")
        if pem:
            return identity_from_cert(pem[0])
        if self.config.allow_anonymous and not self.config.configured:
            return ANONYMOUS_IDENTITY
        if self.config.tokens:
            raise Unauthenticated("send a ServiceAccount token (authorization: Bearer ...)")
        raise Unauthenticated("present a client certificate signed by the frontend's CA")


def bearer_token(metadata: Sequence[tuple[str, str | bytes]]) -> str | None:
    """The token of an ``authorization: Bearer TOKEN`` header, if any."""
    for key, value in metadata:
        if key == "authorization":
            text = value.decode() if isinstance(value, bytes) else value
            scheme, _, token = text.partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                return token.strip()
    return None
