"""The ebpf maps' drift check, pure: what the maps hold compared with what was written."""

from __future__ import annotations

from svcproxy.backends.ebpf.drift import MapDrift, compare
from svcproxy.backends.ebpf.layout import (
    KernelEntry,
    ServiceAddress,
    ServiceValue,
    ep_key,
    pack_target,
)

A, B, C = (ServiceAddress(f"10.96.0.{i}", 80, "TCP").pack() for i in (1, 2, 3))
SLOTS_A = (pack_target("10.244.0.1", 8080), pack_target("10.244.0.2", 8080))
SLOTS_B = (pack_target("10.244.0.3", 8080),)
APPLIED = {A: KernelEntry(ServiceValue(1, 2, 0, 0), SLOTS_A),
           B: KernelEntry(ServiceValue(2, 1, 0, 0), SLOTS_B),
           C: KernelEntry(ServiceValue(0, 0, 2, 0), ())}  # no endpoint: refuse
SERVICES = {k: a.value.pack() for k, a in APPLIED.items()}
ENDPOINTS = {ep_key(1, 0): SLOTS_A[0], ep_key(1, 1): SLOTS_A[1], ep_key(2, 0): SLOTS_B[0]}
WRITTEN = (SERVICES, ENDPOINTS)


def test_maps_as_written_are_no_drift() -> None:
    assert not compare(APPLIED, WRITTEN, dict(SERVICES), dict(ENDPOINTS))


def test_a_lost_or_altered_service_entry_is_that_service_alone() -> None:
    held = {A: SERVICES[A], B: ServiceValue(2, 1, 1, 10800).pack()}
    assert compare(APPLIED, WRITTEN, held, ENDPOINTS) == MapDrift(frozenset({B, C}))


def test_a_lost_or_altered_slot_is_its_service_and_extra_ones_are_stray() -> None:
    endpoints = {ep_key(1, 0): SLOTS_B[0], ep_key(2, 0): SLOTS_B[0], ep_key(7, 0): SLOTS_A[0]}
    drift = compare(APPLIED, WRITTEN, SERVICES, endpoints)
    assert drift == MapDrift(frozenset({A}), stray=frozenset({ep_key(7, 0)}))


def test_an_entry_nobody_wrote_is_foreign() -> None:
    other = ServiceAddress("10.96.0.9", 53, "UDP").pack()
    drift = compare(APPLIED, WRITTEN, {**SERVICES, other: SERVICES[A]}, ENDPOINTS)
    assert drift == MapDrift(foreign=frozenset({other}))
