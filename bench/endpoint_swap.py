"""The benchmarks' one endpoint change: a service port's first endpoint swapped for a fresh one."""

from __future__ import annotations

from dataclasses import replace

from svcproxy.sdk import NodeState, ServicePortKey
from tests.support.nft_fixtures import endpoint, pod_ip


def swap_one_endpoint(state: NodeState, key: ServicePortKey, n: int) -> NodeState:
    """``state`` at the next revision, the first endpoint of ``key`` replaced by a new one
    at ``pod_ip(n)``."""
    record = state.services[key]
    eps = dict(record.endpoints)
    eps.pop(next(iter(eps)))
    new = endpoint(pod_ip(n))
    eps[new.ip] = new
    return replace(state, services={**state.services, key: replace(record, endpoints=eps)},
                   revision=state.revision + 1)
