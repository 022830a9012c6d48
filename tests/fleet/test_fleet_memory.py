"""The fleet's memo of trigger times holds only live service ports (issue 28: no memo
grows with churn)."""

from __future__ import annotations

from svcproxy.frontend.fleet.service import FleetService
from svcproxy.frontend.sources.events import Replace
from tests.support.objects import endpoint, engine_with, node, service, slice_

TRIGGER = "endpoints.kubernetes.io/last-change-trigger-time"


def generation(n: int) -> tuple[list[dict], list[dict]]:
    """Ten services named for generation ``n``, each with a sliced endpoint and a trigger."""
    services, slices = [], []
    for i in range(10):
        name = f"web-{n}-{i}"
        services.append(service(name, ip=f"10.96.{n % 250}.{i + 1}"))
        s = slice_(name, name, [endpoint(f"10.0.{n % 250}.{i + 1}")])
        s["metadata"]["annotations"] = {TRIGGER: f"2026-11-27T05:{n % 60:02d}:{i:02d}Z"}
        slices.append(s)
    return services, slices


def test_trigger_memo_forgets_service_ports_that_are_gone() -> None:
    eng = engine_with(node("n1"))
    fleet = FleetService(eng, epoch="e")
    for n in range(30):  # each generation replaces every service by new ones
        services, slices = generation(n)
        eng.submit([Replace("Service", services), Replace("EndpointSlice", slices)])
    assert fleet._triggers, "trigger times were seen"
    assert len(fleet._triggers) <= 10, len(fleet._triggers)
