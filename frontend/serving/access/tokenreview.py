"""ServiceAccount tokens: checked with the apiserver's TokenReview, bound to a node.

A node's backend sends its projected, audience-bound token. The apiserver says whose
it is (TokenReview, with the audience this frontend is configured for) and which pod
it was issued for (the ``authentication.kubernetes.io/pod-name`` and ``pod-uid``
extras). When its ServiceAccount is one of the agents' (``--node-service-accounts``),
that pod's ``spec.nodeName`` is the node the caller may read and report for
(``authentication.kubernetes.io/node-name`` where the apiserver provides it); a token
whose pod is gone, or was replaced by another pod of the same name, is refused. Any
other pod's token names its pod only (a workload waiting for its own addresses) and is
no node identity.
Results are cached briefly (refusals for at most a second); concurrent checks of one
token share one review.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from kubernetes.client import AuthenticationV1Api, CoreV1Api, V1TokenReview, V1TokenReviewSpec
from kubernetes.client.exceptions import ApiException

from svcproxy.frontend.serving.access import auth_metrics
from svcproxy.frontend.serving.access.auth import Identity, Unauthenticated

log = logging.getLogger(__name__)
EXTRA = "authentication.kubernetes.io/"
SA_PREFIX = "system:serviceaccount:"
CACHE_ENTRIES = 10000
REFUSAL_TTL = 1.0
# Hostile callers: a token longer than this is refused unreviewed, and at most this many
# reviews run at once (a flood of made-up tokens waits here, not on the apiserver).
MAX_TOKEN_BYTES = 16384
MAX_CONCURRENT_REVIEWS = 8


@dataclass(frozen=True, slots=True)
class _Entry:
    expires: float
    identity: Identity | None
    refusal: str = ""


class TokenReviewer:
    """``await reviewer(token)`` -> Identity, or raises Unauthenticated."""

    def __init__(self, api_client: Any, audience: str, cache_ttl: float = 10.0,
                 node_accounts: frozenset[str] = frozenset()) -> None:
        self.audience = audience
        self.cache_ttl = cache_ttl
        # User names whose pod-bound tokens are node identities (the agents').
        self.node_accounts = node_accounts
        self._authn = AuthenticationV1Api(api_client)
        self._core = CoreV1Api(api_client)
        self._cache: OrderedDict[bytes, _Entry] = OrderedDict()
        self._inflight: dict[bytes, asyncio.Future[_Entry]] = {}
        self._addresses: dict[tuple[str, str, str], tuple[float, frozenset[str]]] = {}
        self._slots: asyncio.Semaphore | None = None

    async def __call__(self, token: str) -> Identity:
        if len(token) > MAX_TOKEN_BYTES:
            auth_metrics.TOKEN_REVIEWS.labels("refused").inc()
            raise Unauthenticated(f"the token is longer than {MAX_TOKEN_BYTES} bytes")
        key = hashlib.sha256(token.encode()).digest()
        entry = self._cache.get(key)
        if entry is not None and entry.expires > time.monotonic():
            auth_metrics.TOKEN_REVIEWS.labels("cached").inc()
        else:
            entry = await self._review_once(key, token)
        if entry.identity is None:
            raise Unauthenticated(entry.refusal)
        return entry.identity

    async def _review_once(self, key: bytes, token: str) -> _Entry:
        """One review per token at a time, however many calls wait for it."""
        pending = self._inflight.get(key)
        if pending is not None:
            return await asyncio.shield(pending)
        future: asyncio.Future[_Entry] = asyncio.get_running_loop().create_future()
        self._inflight[key] = future
        if self._slots is None:
            self._slots = asyncio.Semaphore(MAX_CONCURRENT_REVIEWS)
        try:
            async with self._slots:
                entry = await asyncio.to_thread(self._review, token)
            self._remember(key, entry)
            future.set_result(entry)
            return entry
        except BaseException as err:
            future.set_exception(err)
            future.exception()
            raise
        finally:
            del self._inflight[key]

    def _remember(self, key: bytes, entry: _Entry) -> None:
        self._cache[key] = entry
        self._cache.move_to_end(key)
        while len(self._cache) > CACHE_ENTRIES:
            self._cache.popitem(last=False)

    def _review(self, token: str) -> _Entry:
        """Blocking: the TokenReview, then the pod's node (runs in a thread)."""
        body = V1TokenReview(spec=V1TokenReviewSpec(token=token, audiences=[self.audience]))
        try:
            status = self._authn.create_token_review(body).status
        except ApiException as err:
            auth_metrics.TOKEN_REVIEWS.labels("error").inc()
            log.error("TokenReview failed (HTTP %s %s): grant the frontend's account create "
                      "on tokenreviews (see deploy/frontend.yaml)", err.status, err.reason)
            raise Unauthenticated("the token could not be reviewed") from err
        except Exception as err:  # noqa: BLE001 - unreachable apiserver, bad answer
            auth_metrics.TOKEN_REVIEWS.labels("error").inc()
            log.error("TokenReview failed: %s", err)
            raise Unauthenticated("the token could not be reviewed") from err
        if not status or not status.authenticated or not status.user:
            auth_metrics.TOKEN_REVIEWS.labels("refused").inc()
            reason = (status.error if status and status.error else "not authenticated")
            return self._refusal(f"the apiserver refused the token: {reason}")
        if status.audiences and self.audience not in status.audiences:
            auth_metrics.TOKEN_REVIEWS.labels("refused").inc()
            return self._refusal(f"the token is not for audience {self.audience!r}")
        auth_metrics.TOKEN_REVIEWS.labels("authenticated").inc()
        user = status.user
        extra = {k: list(v or []) for k, v in (user.extra or {}).items()}
        node = None
        if user.username in self.node_accounts:
            try:
                node = self._node_of(user.username or "", extra)
            except Unauthenticated as err:
                return self._refusal(str(err))
        pod_name = _one(extra, "pod-name")
        namespace = (user.username or "").removeprefix(SA_PREFIX).partition(":")[0]
        identity = Identity(user.username or "", frozenset(user.groups or ()), node, "token",
                            pod=f"{namespace}/{pod_name}" if pod_name else "",
                            pod_uid=_one(extra, "pod-uid") or "")
        return _Entry(time.monotonic() + self.cache_ttl, identity)

    async def pod_addresses(self, namespace: str, name: str, uid: str) -> frozenset[str]:
        """The IPs of a token's pod (``status.podIPs``), checked to be the pod of ``uid``
        (when given); LookupError saying why when it cannot be told. Remembered for the
        cache TTL."""
        key = (namespace, name, uid)
        hit = self._addresses.get(key)
        if hit is not None and hit[0] > time.monotonic():
            return hit[1]
        try:
            pod = await asyncio.to_thread(self._read_pod, namespace, name)
        except Unauthenticated as err:
            raise LookupError(str(err)) from None
        if uid and (pod.get("metadata") or {}).get("uid") != uid:
            raise LookupError(f"the pod {namespace}/{name} is not the token's (uid {uid})")
        status = pod.get("status") or {}
        ips = {str(entry.get("ip")) for entry in status.get("podIPs") or ()
               if isinstance(entry, dict) and entry.get("ip")}
        if status.get("podIP"):
            ips.add(str(status["podIP"]))
        found = frozenset(ips)
        if len(self._addresses) >= CACHE_ENTRIES:
            self._addresses.clear()
        self._addresses[key] = (time.monotonic() + self.cache_ttl, found)
        return found

    def _refusal(self, reason: str) -> _Entry:
        return _Entry(time.monotonic() + min(self.cache_ttl, REFUSAL_TTL), None, reason)

    def _node_of(self, username: str, extra: dict[str, list[str]]) -> str | None:
        """The node of the pod the token was issued for; None for a token of no pod."""
        pod_name = _one(extra, "pod-name")
        if pod_name is None:
            return None
        node = _one(extra, "node-name")
        if node is not None:
            return node
        namespace = username.removeprefix(SA_PREFIX).partition(":")[0]
        if not username.startswith(SA_PREFIX) or not namespace:
            raise Unauthenticated(f"a pod-bound token of {username!r}, not a ServiceAccount")
        pod = self._read_pod(namespace, pod_name)
        uid = _one(extra, "pod-uid")
        if uid is not None and (pod.get("metadata") or {}).get("uid") != uid:
            raise Unauthenticated(f"the token's pod {namespace}/{pod_name} (uid {uid}) no "
                                  "longer exists; another pod has its name")
        node = (pod.get("spec") or {}).get("nodeName")
        if not isinstance(node, str) or not node:
            raise Unauthenticated(f"the token's pod {namespace}/{pod_name} is on no node")
        return node

    def _read_pod(self, namespace: str, name: str) -> dict[str, Any]:
        """The pod as raw JSON (only two fields are read; no model validation)."""
        try:
            resp: Any = self._core.read_namespaced_pod(name, namespace, _preload_content=False)
            try:
                pod = json.loads(resp.data)
            finally:
                resp.release_conn()
        except ApiException as err:
            if err.status == 404:
                raise Unauthenticated(f"the token's pod {namespace}/{name} no longer "
                                      "exists (pod not found)") from err
            raise Unauthenticated(f"cannot read the token's pod {namespace}/{name} "
                                  f"(HTTP {err.status}): grant the frontend get on pods") from err
        except (OSError, ValueError) as err:
            raise Unauthenticated(f"cannot read the token's pod {namespace}/{name}: "
                                  f"{err}") from err
        if not isinstance(pod, dict):
            raise Unauthenticated(f"the token's pod {namespace}/{name} is not an object")
        return pod


def _one(extra: dict[str, list[str]], name: str) -> str | None:
    values = extra.get(EXTRA + name) or []
    return values[0] if len(values) == 1 and values[0] else None
