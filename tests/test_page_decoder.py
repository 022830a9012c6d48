"""Listed pages decoded in a second process: the same objects as the typed paths make in
this one, the others left to the general path in their places, and a failed process
leaves every page to the caller."""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from svcproxy.frontend.sources.apiserver import ApiserverSource
from svcproxy.frontend.sources.events import Event, RawObject, Replace
from svcproxy.frontend.sources.kubevalidation import ObjectLimits
from svcproxy.frontend.sources.page_decoder import PageDecoder
from svcproxy.frontend.sources.typed_services import decode_service
from svcproxy.frontend.sources.typed_slices import decode_slice
from svcproxy.frontend.store.objects import EndpointSlice, Service
from tests.fakeapiserver import FakeApiserver, write_kubeconfig

SERVICES = [
    {"metadata": {"name": "web", "namespace": "shop"},
     "spec": {"clusterIP": "10.96.0.10", "type": "LoadBalancer",
              "ports": [{"name": "http", "port": 80, "nodePort": 30080, "targetPort": "web"}],
              "sessionAffinity": "ClientIP", "externalTrafficPolicy": "Local"},
     "status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.7", "ipMode": "Proxy"}]}}},
    {"metadata": {"name": "ext", "namespace": "shop"},  # the general path's
     "spec": {"type": "ExternalName", "externalName": "example.com"}},
    {"metadata": {"name": "db", "namespace": "shop",
                  "annotations": {"svcproxy.io/x": "1"}},
     "spec": {"clusterIP": "10.96.0.11", "ports": [{"port": 5432, "protocol": "TCP"}]}},
]
SLICES = [
    {"metadata": {"name": "web-1", "namespace": "shop",
                  "labels": {"kubernetes.io/service-name": "web"},
                  "annotations": {"endpoints.kubernetes.io/last-change-trigger-time":
                                  "2026-11-27T05:00:00Z"}},
     "addressType": "IPv4", "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
     "endpoints": [{"addresses": ["10.0.0.1"], "nodeName": "n1", "zone": "z1",
                    "conditions": {"ready": False, "serving": True, "terminating": True}},
                   {"addresses": ["10.0.0.2", "10.0.0.2"]}]},
    {"metadata": {"name": "web-6", "namespace": "shop",  # IPv6: the general path's
                  "labels": {"kubernetes.io/service-name": "web"}},
     "addressType": "IPv6", "endpoints": [{"addresses": ["fd00::1"]}]},
]


def page(items: list[dict[str, Any]], token: str | None = "t0k") -> bytes:
    meta = {"resourceVersion": "42"} | ({"continue": token} if token else {})
    return json.dumps({"kind": "List", "metadata": meta, "items": items}).encode()


@pytest.fixture
def decoder() -> Any:
    found = PageDecoder(ObjectLimits())
    yield found
    found.close()


def test_a_page_decodes_to_what_the_typed_path_makes_here(decoder: PageDecoder) -> None:
    items = SLICES + SLICES[:1]
    found = decoder.decode("EndpointSlice", page(items))
    assert found is not None
    objs, token, version = found
    assert (token, version) == ("t0k", "42")
    expected = [decode_slice(json.dumps(item).encode(), ObjectLimits())
                or json.dumps(item).encode() for item in items]
    assert isinstance(objs[0], EndpointSlice) and objs[0].trigger_time > 0  # the annotation's
    assert [type(o) for o in objs] == [EndpointSlice, bytes, EndpointSlice]
    assert [json.loads(o) if type(o) is bytes else o for o in objs] == \
        [json.loads(e) if type(e) is bytes else e for e in expected]
    last = decoder.decode("EndpointSlice", page(SLICES[:1], token=None))
    assert last is not None and last[1] is None
    services = decoder.decode("Service", page(SERVICES))
    assert services is not None
    assert services[0] == [decode_service(json.dumps(SERVICES[0]).encode(), ObjectLimits()),
                           json.dumps(SERVICES[1]).encode(),
                           decode_service(json.dumps(SERVICES[2]).encode(), ObjectLimits())]
    assert type(services[0][0]) is Service and services[0][0].load_balancer_ingress


def test_what_is_not_a_page_is_left_to_the_caller(decoder: PageDecoder) -> None:
    assert decoder.decode("EndpointSlice", b'{"items": 3}') is None
    assert decoder.decode("EndpointSlice", b"not json") is None
    assert decoder.decode("EndpointSlice", page(SLICES)) is not None  # still there


def test_limits_reach_the_process() -> None:
    strict = PageDecoder(ObjectLimits(max_name_length=4))
    try:
        found = strict.decode("EndpointSlice", page(SLICES[:1]))
        assert found is not None and type(found[0][0]) is bytes  # left to the general path
    finally:
        strict.close()


def test_a_failed_process_leaves_every_page_to_the_caller(
        decoder: PageDecoder, caplog: pytest.LogCaptureFixture) -> None:
    assert decoder._pid is not None
    os.kill(decoder._pid, signal.SIGKILL)
    with caplog.at_level(logging.WARNING):
        assert decoder.decode("EndpointSlice", page(SLICES)) is None
    assert "page decoding process failed" in caplog.text
    assert decoder._pid is None  # reaped
    assert decoder.decode("EndpointSlice", page(SLICES)) is None


def test_the_source_lists_through_the_process(tmp_path: Path) -> None:
    """Typed objects arrive decoded, the others as RawObject in their places; the source
    ends the process when it stops."""
    fake = FakeApiserver(token="t")
    events: list[Event] = []
    lock = threading.Lock()

    def sink(batch: Sequence[Event]) -> None:
        with lock:
            events.extend(batch)

    try:
        for svc in SERVICES:
            fake.create("Service", svc)
        for sl in SLICES:
            fake.create("EndpointSlice", sl)
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", fake.url, "t")
        decoder = PageDecoder(ObjectLimits())
        source = ApiserverSource(sink, kubeconfig=str(kubeconfig), page_decoder=decoder)
        source.start()
        try:
            assert source.synced.wait(30)
        finally:
            source.stop()
        assert decoder._pid is None
        with lock:
            listed = {e.kind: e.objs for e in events if isinstance(e, Replace)}
        names = [getattr(o, "name", None) for o in listed["Service"]]
        assert [type(o) for o in listed["Service"]] == [Service, RawObject, Service]
        assert names == ["db", None, "web"]  # in the listing's order (by name)
        assert [type(o) for o in listed["EndpointSlice"]] == [EndpointSlice, RawObject]
    finally:
        fake.close()
