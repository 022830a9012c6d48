"""The frontend's /metrics over real HTTP: revisions, clients, invalid objects."""

from __future__ import annotations

import socket
import urllib.request
from pathlib import Path

from svcproxy.frontend.main import start_metrics
from svcproxy.frontend.sources.events import Upsert
from svcproxy.sdk.client import NodeStateClient
from tests.support.examples import copy_examples, web_slice
from tests.support.waiting import wait_for


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scrape(port: int) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def test_metrics_move_with_clients_and_changes(frontend_factory, tmp_path: Path) -> None:
    port = free_port()
    fe = frontend_factory(copy_examples(tmp_path))
    start_metrics(f"127.0.0.1:{port}")
    before = scrape(port)
    client = NodeStateClient(fe.opts.listen, "node-a")
    client.start()
    try:
        wait_for(client.has_changes)
        during = scrape(port)
        assert during["svcproxy_frontend_watch_clients"] == \
            before["svcproxy_frontend_watch_clients"] + 1
        fe.submit([Upsert("EndpointSlice", web_slice(4)),
                   Upsert("Service", {"kind": "Service", "metadata": {"name": "bad"},
                                      "spec": {"clusterIP": "10.0.0.1",
                                               "ports": [{"port": 0}]}})])
        after = scrape(port)
        assert after["svcproxy_frontend_revision"] > during["svcproxy_frontend_revision"]
        key = ('svcproxy_frontend_rejected_objects_total{kind="Service",reason="invalid_port",'
               'source="manifests"}')
        assert after[key] == before.get(key, 0) + 1
    finally:
        client.stop()
    wait_for(lambda: scrape(port)["svcproxy_frontend_watch_clients"] ==
             before["svcproxy_frontend_watch_clients"])
