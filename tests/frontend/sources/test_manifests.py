"""The manifest source: valid, invalid and changing files."""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from svcproxy.frontend.intake import intake
from svcproxy.frontend.runtime import metrics
from svcproxy.frontend.sources.events import Event, Replace
from svcproxy.frontend.sources.manifests import ManifestSource
from svcproxy.model import Protocol, ServicePortKey
from tests.support.examples import WEB, copy_examples
from tests.support.waiting import wait_for

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


def service_doc(name: str, ip: int) -> str:
    return (f"apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: shop}}\n"
            f"spec: {{clusterIP: 10.96.1.{ip}, ports: [{{name: http, port: 80}}]}}\n")


_LEVELS = "".join(f"{k}: &{k} [{', '.join([f'*{p}'] * 9)}]\n"
                  for p, k in zip("abcde", "bcdef", strict=True))
# Documents that parse (the file's next document is found) but that must not or cannot be
# built, each with what its refusal says.
UNBUILDABLE = {
    # the inner list is built after the outer one fails: left pending, it would fail the
    # next document were the loader not reset
    "binary": ("kind: Service\nmetadata: {name: bin, namespace: shop}\n"
               "spec: {note: [[!!binary a], !!binary a]}\n", "base64"),
    "date": ("kind: Service\nmetadata: {name: date, namespace: shop, "
             "creationTimestamp: 2026-13-45}\n", "month must be in 1..12"),
    "tag": ("kind: Service\nmetadata: !unknown {name: tag, namespace: shop}\n", "!unknown"),
    "int": (f"kind: Service\nmetadata: {{name: big, namespace: shop}}\n"
            f"spec: {{ports: [{{port: {'9' * 5000}}}]}}\n", "digits"),
    "key": ("kind: Service\nmetadata: {name: key, namespace: shop}\nspec:\n  ports:\n"
            "  - ? [a]\n    : b\n", "unhashable"),
    "self": ("kind: Service\nmetadata: &m {name: r, self: *m}\n", "refers to the node"),
    "bomb": ("kind: Service\na: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + _LEVELS
             + "metadata: {name: *f, namespace: shop}\n", "--manifest-max-alias-expansion"),
}


def file_refusals() -> float:
    return sum(s.value for m in metrics.REJECTED_OBJECTS.collect() for s in m.samples
               if s.name.endswith("_total") and s.labels["source"] == "manifests"
               and s.labels["kind"] == "File")


@contextmanager
def logged() -> Iterator[list[str]]:
    """The messages the intake logs meanwhile (refusals)."""
    lines: list[str] = []
    handler = logging.Handler(logging.ERROR)
    handler.emit = lambda record: lines.append(record.getMessage())  # type: ignore[method-assign]
    logger = intake.log
    logger.addHandler(handler)
    try:
        yield lines
    finally:
        logger.removeHandler(handler)


def test_a_document_that_cannot_be_built_is_refused_alone(frontend_factory, tmp_path: Path,
                                                          ) -> None:  # type: ignore[no-untyped-def]
    d = copy_examples(tmp_path)
    multi = d / "multi.yaml"
    multi.write_text("---\n".join([service_doc("m1", 1), UNBUILDABLE["date"][0],
                                   service_doc("m2", 2), UNBUILDABLE["binary"][0],
                                   UNBUILDABLE["tag"][0], service_doc("m3", 3)]))
    before = file_refusals()
    with logged() as lines:
        fe = frontend_factory(d)
        wait_for(lambda: fe.engine.synced.is_set())
        names = {k.name for k in fe.records()}
        assert {"web", "api", "m1", "m2", "m3"} <= names, names
        mine = [line for line in lines if "multi.yaml" in line]
        for number, bad in ((2, "date"), (4, "binary"), (5, "tag")):
            assert any(f"multi.yaml (document {number})" in line and UNBUILDABLE[bad][1] in line
                       for line in mine), mine
        assert len(mine) == 3, mine
        assert file_refusals() - before == 3
        # An edit that spoils one document still brings the others' changes.
        multi.write_text("---\n".join([service_doc("m1", 1), UNBUILDABLE["key"][0],
                                       service_doc("m4", 4)]))
        wait_for(lambda: any(k.name == "m4" for k in fe.records()))
        names = {k.name for k in fe.records()}
        assert "m1" in names and not names & {"m2", "m3"}, names
        assert any("multi.yaml (document 2)" in line and "unhashable" in line for line in lines)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 4), st.sampled_from(sorted(UNBUILDABLE)), st.data())
def test_one_unbuildable_document_anywhere_never_loses_the_others(count: int, bad: str,
                                                                  data: st.DataObject) -> None:
    at = data.draw(st.integers(0, count))
    docs = [service_doc(f"s{i}", i + 1) for i in range(count)]
    docs.insert(at, UNBUILDABLE[bad][0])
    sent: list[Event] = []
    before = file_refusals()
    with tempfile.TemporaryDirectory() as tmp, logged() as lines:
        (Path(tmp) / "multi.yaml").write_text("---\n".join(docs))
        ManifestSource(Path(tmp), sent.extend, use_inotify=False).load_all()
    served = sorted(o["metadata"]["name"] for ev in sent if isinstance(ev, Replace)
                    for o in ev.objs)
    assert served == [f"s{i}" for i in range(count)]
    assert len(lines) == 1 and f"multi.yaml (document {at + 1})" in lines[0], lines
    assert UNBUILDABLE[bad][1] in lines[0]
    assert file_refusals() - before == 1
