"""An element a service port renders twice is claimed once (regression: a NodePort
service's endpoint is in ``hairpin`` for its ClusterIP and its external chain, and
removing that endpoint in a delta failed with "claimed but has no claimant")."""

from __future__ import annotations

from dataclasses import replace

from svcproxy.backends.nft.context import family_context
from svcproxy.backends.nft.render import render_service
from svcproxy.backends.nft.render_table import build_table, commit, plan_delta
from svcproxy.model import ServiceType
from tests.support.nft_fixtures import CONFIG, endpoint, key, service, state_of

CTX = family_context(CONFIG, None, 4)


def test_removing_an_endpoint_of_a_node_port_service_leaves_what_a_full_sync_would() -> None:
    svc = service("np", "10.96.0.5", type=ServiceType.NODE_PORT, node_port=30005)
    before = state_of(svc, endpoint("10.244.1.10"), endpoint("10.244.1.11"))
    rules = render_service(before, CTX)
    assert rules is not None
    hairpin = [e for e in rules.elements if e[0] == "hairpin"]
    assert len(hairpin) > len(set(hairpin))  # the same element twice in one service port
    table = build_table(CTX, {key("np"): rules})
    after = replace(before, endpoints={"10.244.1.11": before.endpoints["10.244.1.11"]})
    delta = plan_delta(table, {key("np"): rules}, {key("np"): render_service(after, CTX)})
    assert "delete element ip svcproxy hairpin { 10.244.1.10 . 10.244.1.10 }" in delta.text
    commit(table, delta)
    fresh = build_table(CTX, {key("np"): render_service(after, CTX)})  # type: ignore[dict-item]
    assert table.claims == fresh.claims and table.applied == fresh.applied
