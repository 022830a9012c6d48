"""Objects nested as deep as the apiserver stores them are served, through manifests and
the apiserver: Kubernetes decodes 10,000 nested maps and lists (the object included),
so an object may carry fields svcproxy does not read 9,999 levels below it; one level
more the apiserver refuses, and so does svcproxy, naming --max-object-depth."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from svcproxy.frontend.edge.limits import KUBERNETES_MAX_DEPTH
from svcproxy.frontend.edge.verdict import Problem
from svcproxy.frontend.intake.intake import Intake
from svcproxy.frontend.pipeline.engine import Engine
from svcproxy.frontend.sources.manifests import ManifestLimits, ManifestSource, parse_text
from tests.support.fakeapiserver import FakeApiserver, write_kubeconfig
from tests.support.hostile import endpoint_slice, node, service
from tests.support.refusal_log import refusals_logged
from tests.support.waiting import wait_for


def nested(levels: int) -> Any:
    """A list whose innermost list is ``levels`` levels below it (0: itself)."""
    value: list[Any] = ["leaf"]
    for _ in range(levels):
        value = [value]
    return value


def deep_service(name: str, depth: int, ip: str) -> dict[str, Any]:
    """A Service with an unknown field whose innermost list is ``depth`` levels below
    the object (spec is level 1, the field's outer list level 2)."""
    obj = service(name, ip=ip)
    obj["spec"]["x-unknown"] = nested(depth - 2)
    return obj


def deep_service_yaml(name: str, depth: int, ip: str) -> str:
    """``deep_service`` as block YAML ("- - - leaf"): libyaml takes 10,000 levels of
    it in about a second, of flow lists ("[[[leaf]]]") in several."""
    obj = service(name, ip=ip)
    obj["spec"]["x-unknown"] = "HERE"
    return yaml.safe_dump(obj).replace(
        "  x-unknown: HERE\n", "  x-unknown:\n  " + "- " * (depth - 1) + "leaf\n")


@contextmanager
def recursion_limit(limit: int) -> Iterator[None]:
    """Room for this test's own recursive helpers (json.dumps, the stand-in's deepcopy)."""
    before = sys.getrecursionlimit()
    sys.setrecursionlimit(max(before, limit))
    try:
        yield
    finally:
        sys.setrecursionlimit(before)


def test_a_manifest_as_deep_as_the_apiserver_takes_is_served_one_level_more_refused_alone(
        tmp_path: Path) -> None:
    (tmp_path / "deep.yaml").write_text(
        deep_service_yaml("deep", KUBERNETES_MAX_DEPTH, "10.96.0.20"))
    (tmp_path / "abyss.yaml").write_text(
        deep_service_yaml("abyss", KUBERNETES_MAX_DEPTH + 1, "10.96.0.21"))
    (tmp_path / "others.yaml").write_text("\n---\n".join(map(json.dumps, [
        service(), endpoint_slice(), node()])))
    eng = Engine()
    eng.store.intake = Intake("manifests")
    with refusals_logged() as lines:
        ManifestSource(tmp_path, eng.submit, use_inotify=False).load_all()
    assert {name for _, name in eng.store.services} == {"web", "deep"}
    refused = [line for line in lines if "abyss.yaml" in line]
    assert len(lines) == len(refused) == 1, lines
    assert "--max-object-depth" in refused[0] and "9999" in refused[0], refused


def test_the_apiserver_source_serves_objects_as_deep_as_the_apiserver_stores(
        frontend_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Listed (one page holds it) and then watched: each is decoded and served, and the
    objects beside it too."""
    api = FakeApiserver(token="t")
    try:
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", api.url, "t")
        api.create("Node", node())
        api.create("Service", service())
        with recursion_limit(3 * KUBERNETES_MAX_DEPTH):
            api.create("Service", deep_service("listed", KUBERNETES_MAX_DEPTH, "10.96.0.20"))
        fe = frontend_factory(None, kubeconfig=str(kubeconfig))
        services = fe.engine.store.services
        wait_for(lambda: {name for _, name in list(services)} >= {"web", "listed"},
                 timeout=60)
        with recursion_limit(3 * KUBERNETES_MAX_DEPTH):
            api.create("Service", deep_service("watched", KUBERNETES_MAX_DEPTH, "10.96.0.21"))
        api.create("Service", service("after", ip="10.96.0.22"))
        wait_for(lambda: {name for _, name in list(services)} >= {"watched", "after"},
                 timeout=60)
    finally:
        api.close()


def test_a_yaml_alias_is_as_deep_as_where_it_is_used() -> None:
    """sigs.k8s.io/yaml expands aliases before decoding the JSON: an anchored list 5
    levels deep used 6 levels down reaches 11 levels (spec is 1)."""
    text = "kind: Service\nmetadata: {name: d}\na: &a [[[[[x]]]]]\nspec: {b: [[[[[*a]]]]]}\n"
    deep, = parse_text(Path("x.yaml"), text, ManifestLimits(max_depth=10))
    assert isinstance(deep, Problem) and "--max-object-depth" in deep.message, deep
    served, = parse_text(Path("x.yaml"), text, ManifestLimits(max_depth=11))
    assert served["spec"]["b"][0][0][0][0][0] == [[[[["x"]]]]]


_DECODE_DEEPEST = f"""
import json, threading, msgspec
from svcproxy.frontend.edge.limits import allow_kubernetes_depth
allow_kubernetes_depth()
doc = ('{{"a":' * {KUBERNETES_MAX_DEPTH} + '1' + '}}' * {KUBERNETES_MAX_DEPTH}).encode()
def decode():
    msgspec.json.decode(doc)
    json.loads(doc)
worker = threading.Thread(target=decode)
worker.start()
worker.join()
decode()
print("decoded")
"""


def test_the_deepest_object_decodes_whatever_the_stack_limit() -> None:
    """A frontend started with `ulimit -s unlimited` (glibc then gives each thread
    2 MiB) or a small soft stack limit decodes the deepest object in a thread and in the main
    thread: without room made on the stack, the process dies of SIGSEGV."""
    for limit in ("unlimited", "-S 4096"):
        run = subprocess.run(
            ["bash", "-c", f'ulimit -s {limit} && exec "$0" -c "$1"', sys.executable,
             _DECODE_DEEPEST], capture_output=True, text=True, timeout=120)
        assert (run.returncode, run.stdout.strip()) == (0, "decoded"), (limit, run.stderr)
