"""On the node, one service's failure stays one service's: real kernel, real packets.

The scenario lab (real frontend watching manifests, real backend process on node1,
echo pods) per backend. The test makes the kernel refuse one Service's rules with a
conflicting object it creates in node1's namespace (nft: an element of the backend's
``service-ips`` map holding that Service's address with another verdict, "File
exists"; iptables: a base chain named as its KUBE-SVC chain, "File exists" /
"Operation not supported"). Other Services, old and new, keep working; the refused
one is reported on /healthz and /metrics until a new version of it is accepted.
"""

from __future__ import annotations

import http.client
import json
import re
import subprocess
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from svcproxy.backends.iptables import names as ipt_names
from svcproxy.backends.nft import names as nft_names
from svcproxy.model import Protocol, ServicePortKey
from tests.support.lab import manifests as m
from tests.support.lab.manifests import NAMESPACE
from tests.support.lab.netns import call_in
from tests.support.netns.backends import BackendCase
from tests.support.netns.harness import NODE, ScenarioLab, missing_requirements
from tests.support.world_fixture import running

pytestmark = pytest.mark.netns
_why = missing_requirements()
HEALTHZ, METRICS = 10256, 10249
FLAGS = ("--healthz-bind-address", f"127.0.0.1:{HEALTHZ}",
         "--metrics-bind-address", f"127.0.0.1:{METRICS}")
CASES = (BackendCase("nft", FLAGS), BackendCase("iptables", FLAGS))
A, B, C = "10.96.30.1", "10.96.30.2", "10.96.30.3"


@pytest.fixture(params=CASES, ids=str)
def lab(request: pytest.FixtureRequest) -> Iterator[ScenarioLab]:
    if _why:
        pytest.skip(_why)
    yield from running(ScenarioLab(request.param))


def web(lab: ScenarioLab, name: str, cip: str, *pods: str) -> list[m.Doc]:
    return [m.service(name, (cip,), [m.port("http", 80, 8080)]),
            m.endpoint_slice(name, [m.endpoint(lab.spec.pod(p), 4) for p in pods],
                             [m.slice_port("http", 8080)], 4)]


def answered_by(lab: ScenarioLab, host: str, pods: set[str]) -> Callable[[], None]:
    def check() -> None:
        seen = lab.probe("client", "tcp", host, 80, 6, timeout=0.5)
        assert not seen.errors and seen.answered == pods, f"{host}: {seen}"
    return check


def get(lab: ScenarioLab, port: int, path: str) -> str:
    def fetch() -> str:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        conn.request("GET", path)
        body = conn.getresponse().read().decode()
        conn.close()
        return body
    return call_in(lab.lab.ns(NODE), fetch)


def refused_metric(lab: ScenarioLab) -> float:
    text = get(lab, METRICS, "/metrics")
    found = re.search(rf'^svcproxy_backend_refused_services{{backend="{lab.backend.name}"}} '
                      r"(\S+)$", text, re.MULTILINE)
    assert found, "svcproxy_backend_refused_services not exported"
    return float(found.group(1))


def healthz(lab: ScenarioLab) -> dict[str, Any]:
    return json.loads(get(lab, HEALTHZ, "/healthz"))  # type: ignore[no-any-return]


def conflict(lab: ScenarioLab, add: bool) -> None:
    """Create (or remove) the object that makes the kernel refuse Service c's rules."""
    ns = lab.lab.ns(NODE)
    if lab.backend.name == "nft":
        verb = "add" if add else "delete"
        element = f"{{ {C} . tcp . 80 : drop }}" if add else f"{{ {C} . tcp . 80 }}"
        argv = ["nft", verb, "element", "ip", nft_names.TABLE, "service-ips", element]
    else:
        chain = ipt_names.SVC_PREFIX + ipt_names.service_hash(
            ServicePortKey(NAMESPACE, "c", "http", Protocol.TCP))
        argv = ["nft", "add" if add else "delete", "chain", "ip", "nat", chain]
        if add:
            argv.append("{ type nat hook output priority 5; }")
    subprocess.run(["ip", "netns", "exec", ns, *argv], check=True, capture_output=True)


def test_a_refused_service_is_alone_reported_and_retried_when_it_changes(
        lab: ScenarioLab) -> None:
    lab.apply("a.yaml", web(lab, "a", A, "pod-a"))
    lab.eventually(answered_by(lab, A, {"pod-a"}))
    conflict(lab, add=True)

    lab.apply("c.yaml", web(lab, "c", C, "pod-c"))
    lab.apply("b.yaml", web(lab, "b", B, "pod-b"))
    lab.eventually(answered_by(lab, B, {"pod-b"}))
    lab.eventually(lambda: _assert_refused(lab, 1.0))
    answered_by(lab, A, {"pod-a"})()
    assert lab.probe("client", "tcp", C, 80, 1, timeout=0.5).errors, "c must not be served"
    detail = healthz(lab)["refusedServicePorts"]
    assert detail["count"] == 1
    assert detail["servicePorts"][0]["servicePort"] == f"{NAMESPACE}/c:http/TCP"
    assert "File exists" in detail["servicePorts"][0]["error"] or (
        "Operation not supported" in detail["servicePorts"][0]["error"])
    assert lab.agent is not None and f"refused service port {NAMESPACE}/c:http/TCP" in (
        lab.agent.tail(1000))

    # Another edit elsewhere is applied while c stays refused.
    lab.apply("a.yaml", web(lab, "a", A, "pod-a", "pod-b"))
    lab.eventually(answered_by(lab, A, {"pod-a", "pod-b"}))
    assert refused_metric(lab) == 1.0

    # Without the conflict, a new version of c is tried, programmed and no longer reported.
    conflict(lab, add=False)
    lab.apply("c.yaml", web(lab, "c", C, "pod-d"))
    lab.eventually(answered_by(lab, C, {"pod-d"}))
    lab.eventually(lambda: _assert_refused(lab, 0.0))
    assert "refusedServicePorts" not in healthz(lab)


def _assert_refused(lab: ScenarioLab, count: float) -> None:
    assert refused_metric(lab) == count
