"""ServiceAccount tokens for the stand-in apiserver, reviewed as the apiserver does.

``TokenIssuer.issue`` makes a token as the kubelet would get one through TokenRequest
(audience-bound, expiring, optionally bound to a pod); ``review`` answers a
``TokenReview`` (authentication.k8s.io/v1) the way kube-apiserver's ServiceAccount
token authenticator does: unknown, expired or wrong-audience tokens are not
authenticated; a pod-bound token is refused once its pod is gone or replaced (a pod of
the same name with another uid), unless ``verify_pod_binding`` is off; the user carries
the pod-name/pod-uid extras (and node-name with ``node_name_extra``, as 1.30+ does).
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

EXTRA = "authentication.kubernetes.io/"


@dataclass(frozen=True)
class IssuedToken:
    namespace: str
    service_account: str
    audiences: tuple[str, ...]
    expires: float
    pod: tuple[str, str] | None  # (name, uid)
    node: str | None


class TokenIssuer:
    """The tokens the stand-in knows; ``pods`` looks a pod up as (namespace, name)."""

    def __init__(self, pods: Callable[[str, str], dict[str, Any] | None]) -> None:
        self._pods = pods
        self._tokens: dict[str, IssuedToken] = {}
        self._lock = threading.Lock()
        self.reviews = 0
        self.verify_pod_binding = True
        self.node_name_extra = False

    def issue(self, namespace: str, service_account: str, *, audiences: tuple[str, ...],
              pod: dict[str, Any] | None = None, expires_in: float = 3600) -> str:
        token = secrets.token_urlsafe(32)
        bound = None
        node = None
        if pod is not None:
            bound = (pod["metadata"]["name"], pod["metadata"]["uid"])
            node = pod.get("spec", {}).get("nodeName")
        with self._lock:
            self._tokens[token] = IssuedToken(namespace, service_account, tuple(audiences),
                                              time.time() + expires_in, bound, node)
        return token

    def review(self, body: dict[str, Any]) -> dict[str, Any]:
        """The TokenReview object the apiserver answers with."""
        spec = body.get("spec") or {}
        wanted = list(spec.get("audiences") or [])
        with self._lock:
            self.reviews += 1
            issued = self._tokens.get(str(spec.get("token") or ""))
        status = self._status(issued, wanted)
        return {"kind": "TokenReview", "apiVersion": "authentication.k8s.io/v1",
                "metadata": {"creationTimestamp": None}, "spec": spec, "status": status}

    def _status(self, issued: IssuedToken | None, wanted: list[str]) -> dict[str, Any]:
        if issued is None:
            return _refused("invalid bearer token")
        if issued.expires <= time.time():
            return _refused("invalid bearer token, token is expired (exp)")
        audiences = [a for a in issued.audiences if a in wanted] if wanted else []
        if wanted and not audiences:
            return _refused(f"token audiences {list(issued.audiences)} is invalid for the "
                            f"target audiences {wanted}")
        extra: dict[str, list[str]] = {}
        if issued.pod is not None:
            name, uid = issued.pod
            if self.verify_pod_binding:
                pod = self._pods(issued.namespace, name)
                if pod is None:
                    return _refused(f'pods "{name}" not found')
                if pod["metadata"]["uid"] != uid:
                    return _refused(f"the UID in the bound object reference ({uid}) does "
                                    f"not match the UID in record")
            extra = {EXTRA + "pod-name": [name], EXTRA + "pod-uid": [uid]}
            if self.node_name_extra and issued.node:
                extra[EXTRA + "node-name"] = [issued.node]
        ns, sa = issued.namespace, issued.service_account
        return {"authenticated": True, "audiences": audiences or list(issued.audiences),
                "user": {"username": f"system:serviceaccount:{ns}:{sa}", "uid": "u-" + sa,
                         "groups": ["system:serviceaccounts", f"system:serviceaccounts:{ns}",
                                    "system:authenticated"],
                         "extra": extra}}


def _refused(error: str) -> dict[str, Any]:
    return {"authenticated": False, "user": {}, "error": error}
