"""A fixed world churned for ever, as rollouts do: shared by tests/frontend/test_soak.py and
bench/bench_soak.py.

The world is ``services`` Services with one EndpointSlice each (``endpoints`` pods) on
``nodes`` Nodes in two zones; the object count never changes. Each ``Rollouts.step`` is
one change of one slice, as a Deployment's rollout and its probes make them: a pod goes
terminating, is replaced by a new pod with a new IP (not ready yet), which then turns
ready; or a ready pod's readiness flips. New IPs keep coming (a counter), so nothing
seen before is seen again: whatever is kept per IP or per version grows unless it is
bounded by what is live.
"""

from __future__ import annotations

import random
import time
from typing import Any

TRIGGER = "endpoints.kubernetes.io/last-change-trigger-time"


def node(i: int) -> dict[str, Any]:
    return {"kind": "Node", "metadata": {"name": f"node-{i}", "labels": {
        "topology.kubernetes.io/zone": f"zone-{i % 2}"}}}


def service(i: int) -> dict[str, Any]:
    return {"kind": "Service", "metadata": {"name": f"svc-{i}", "namespace": "soak"},
            "spec": {"type": "ClusterIP", "clusterIP": f"10.96.{i // 250}.{i % 250 + 1}",
                     "clusterIPs": [f"10.96.{i // 250}.{i % 250 + 1}"],
                     "ports": [{"name": "http", "port": 80, "targetPort": 8080,
                                "protocol": "TCP"}]}}


class Rollouts:
    """The world's objects and the next change of one of its slices."""

    def __init__(self, services: int = 60, endpoints: int = 6, nodes: int = 20,
                 seed: int = 1) -> None:
        self.rng = random.Random(seed)
        self.nodes = [node(i) for i in range(nodes)]
        self.services = [service(i) for i in range(services)]
        self._next_ip = 0
        self.slices = [self._slice(i, [self._pod(nodes) for _ in range(endpoints)])
                       for i in range(services)]
        self.changes = 0

    def _pod(self, nodes: int) -> dict[str, Any]:
        """A new, ready pod with an IP never used before (10.128.0.0/9 wraps after 8M)."""
        n = self._next_ip = (self._next_ip + 1) % (1 << 23)
        return {"addresses": [f"10.{128 + (n >> 16)}.{n >> 8 & 255}.{n & 255}"],
                "nodeName": f"node-{self.rng.randrange(nodes)}",
                "conditions": {"ready": True, "serving": True, "terminating": False}}

    def _slice(self, i: int, eps: list[dict[str, Any]]) -> dict[str, Any]:
        return {"kind": "EndpointSlice", "addressType": "IPv4",
                "metadata": {"name": f"svc-{i}-abcde", "namespace": "soak",
                             "labels": {"kubernetes.io/service-name": f"svc-{i}"},
                             "annotations": {TRIGGER: _now()}},
                "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
                "endpoints": eps}

    def objects(self) -> dict[str, list[dict[str, Any]]]:
        """Every object of the world now, by kind."""
        return {"Node": list(self.nodes), "Service": list(self.services),
                "EndpointSlice": [self._copy(s) for s in self.slices]}

    @staticmethod
    def _copy(obj: dict[str, Any]) -> dict[str, Any]:
        """A slice as a source hands it over (nothing shared with the world's)."""
        meta = obj["metadata"]
        return {**obj, "metadata": {**meta, "labels": dict(meta["labels"]),
                                    "annotations": dict(meta["annotations"])},
                "endpoints": [{**ep, "conditions": dict(ep["conditions"])}
                              for ep in obj["endpoints"]]}

    def step(self) -> dict[str, Any]:
        """The next change: one slice as it is after it (a copy)."""
        self.changes += 1
        rng = self.rng
        index = rng.randrange(len(self.slices))
        eps = self.slices[index]["endpoints"]
        pos = rng.randrange(len(eps))
        cond = eps[pos]["conditions"]
        if cond["terminating"]:
            eps[pos] = self._pod(len(self.nodes))
            eps[pos]["conditions"]["ready"] = eps[pos]["conditions"]["serving"] = False
        elif not cond["ready"]:
            cond["ready"] = cond["serving"] = True
        elif rng.random() < 0.5:
            cond.update(ready=False, serving=rng.random() < 0.5, terminating=True)
        else:
            cond["ready"] = False
        self.slices[index]["metadata"]["annotations"][TRIGGER] = _now()
        return self._copy(self.slices[index])


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
