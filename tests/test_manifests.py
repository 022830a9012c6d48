"""The manifest source: valid, invalid and changing files."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from svcproxy.model import Protocol, ServicePortKey
from tests.conftest import wait_for
from tests.test_stream import WEB, copy_examples

API = ServicePortKey("shop", "api", "http", Protocol.TCP)


def endpoints(fe, key: ServicePortKey) -> Any:  # type: ignore[no-untyped-def]
    """The endpoints of ``key``'s record on node-a, none while it has no record."""
    record = fe.records().get(key)
    return record.endpoints if record is not None else {}


def test_examples_load_and_skip_unproxied(frontend_factory, tmp_path: Path) -> None:
    fe = frontend_factory(copy_examples(tmp_path))
    wait_for(lambda: fe.engine.synced.is_set())
    names = {k.name for k in fe.records()}
    assert names == {"web", "api", "gateway", "dns"}


def test_edit_and_delete_files_are_picked_up(frontend_factory, tmp_path: Path) -> None:
    d = copy_examples(tmp_path)
    fe = frontend_factory(d)
    wait_for(lambda: WEB in fe.records())
    web = d / "web.yaml"
    web.write_text(web.read_text().replace("- addresses: [10.244.2.10]",
                                           "- addresses: [10.244.2.99]"))
    wait_for(lambda: "10.244.2.99" in endpoints(fe, WEB))
    (d / "api.yaml").unlink()
    wait_for(lambda: API not in fe.records())


def test_broken_file_reported_and_last_good_state_kept(frontend_factory, tmp_path: Path,
                                                       caplog) -> None:  # type: ignore[no-untyped-def]
    d = copy_examples(tmp_path)
    fe = frontend_factory(d)
    wait_for(lambda: API in fe.records())
    caplog.set_level(logging.ERROR)
    (d / "api.yaml").write_text("apiVersion: v1\nkind: Service\nmetadata: {name: api\n  bad: [\n")
    wait_for(lambda: any("api.yaml:" in r.getMessage() for r in caplog.records))
    (d / "new.yaml").write_text(
        "kind: Service\nmetadata: {name: dns2, namespace: kube-system}\n"
        "spec: {clusterIP: 10.96.0.54, ports: [{port: 53, protocol: UDP}]}\n")
    wait_for(lambda: any(k.name == "dns2" for k in fe.records()))
    assert API in fe.records(), "the broken file's objects must keep their last good state"
    message = next(r.getMessage() for r in caplog.records if "api.yaml:" in r.getMessage())
    assert "api.yaml:4" in message or "api.yaml:5" in message


def test_invalid_object_in_valid_file_skipped_alone(frontend_factory, tmp_path: Path,
                                                    caplog) -> None:  # type: ignore[no-untyped-def]
    d = copy_examples(tmp_path)
    (d / "api.yaml").write_text((d / "api.yaml").read_text().replace("port: 8080,", "port: -1,"))
    caplog.set_level(logging.ERROR)
    fe = frontend_factory(d)
    wait_for(lambda: WEB in fe.records())
    assert API not in fe.records()
    assert any("rejected Service shop/api" in r.getMessage() and "between 1 and" in r.getMessage()
               for r in caplog.records)


def test_object_moved_between_files_is_not_deleted(frontend_factory, tmp_path: Path) -> None:
    d = copy_examples(tmp_path)
    fe = frontend_factory(d)
    wait_for(lambda: API in fe.records())
    revision = fe.engine.changelog.revision
    (d / "moved.yaml").write_text((d / "api.yaml").read_text())
    (d / "api.yaml").unlink()
    wait_for(lambda: fe.engine.store.listed and fe.frontend._source._seen is not None
             and (d / "moved.yaml") in fe.frontend._source._seen
             and (d / "api.yaml") not in fe.frontend._source._seen)
    fe.submit([])  # runs after the source's pending batches on the loop
    assert API in fe.records()
    assert fe.engine.changelog.revision == revision, "moving an object is not a change"
