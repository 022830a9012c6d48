"""Every refusal is seen: each refused manifest object is logged and counted once per
version of its file, named or not (the intake's memo keys on file and position)."""

from __future__ import annotations

from pathlib import Path

import pytest

from svcproxy.frontend.intake.intake import Intake
from svcproxy.frontend.runtime import metrics
from svcproxy.frontend.sources.manifests import ManifestSource
from svcproxy.frontend.store.store import Store
from tests.support.refusal_log import refusals_logged


def refused(reason: str = "malformed") -> float:
    return metrics.REJECTED_OBJECTS.labels("manifests", "Service", reason)._value.get()


@pytest.mark.parametrize("metadata", ["[1]", "{namespace: shop}", "{name: ''}"],
                         ids=["not-a-mapping", "no-name", "empty-name"])
def test_unnamed_objects_of_three_files_are_each_logged_and_counted(
        tmp_path: Path, metadata: str) -> None:
    for n in range(3):
        (tmp_path / f"f{n}.yaml").write_text(f"kind: Service\nmetadata: {metadata}\n"
                                             "spec: {ports: [{port: 80}]}\n")
    store = Store(Intake("manifests"))
    source = ManifestSource(tmp_path, store.apply, use_inotify=False)
    before = refused()
    with refusals_logged() as lines:
        source.load_all()
        assert len(lines) == 3, lines
        for n in range(3):
            assert sum(f"f{n}.yaml (document 1)" in line for line in lines) == 1, lines
        assert refused() - before == 3
        # A new version of one file: its refusal is said again, the others' are not.
        source.apply([tmp_path / "f1.yaml"], [])
        assert len(lines) == 4 and "f1.yaml (document 1)" in lines[3], lines
    assert refused() - before == 4
    assert not store.services


def test_two_unnamed_objects_of_one_file_are_each_logged(tmp_path: Path) -> None:
    (tmp_path / "two.yaml").write_text("kind: Service\nmetadata: [1]\n---\n"
                                       "kind: Service\nmetadata: [1]\n")
    store = Store(Intake("manifests"))
    before = refused()
    with refusals_logged() as lines:
        ManifestSource(tmp_path, store.apply, use_inotify=False).load_all()
    assert len(lines) == 2 and "(document 1)" in lines[0] and "(document 2)" in lines[1], lines
    assert refused() - before == 2


def test_an_unchanged_refusal_from_the_apiserver_is_said_once() -> None:
    """What the memo is for: a relisted object refused again is not logged again."""
    store = Store(Intake("apiserver"))
    bad = {"kind": "Service", "metadata": {"name": "web", "namespace": "shop"},
           "spec": {"ports": [{"port": 0}]}}
    before = metrics.REJECTED_OBJECTS.labels("apiserver", "Service", "invalid_port")._value.get()
    with refusals_logged() as lines:
        for _ in range(3):
            store.intake.parse("Service", dict(bad), served=False)
    assert len(lines) == 1, lines
    assert metrics.REJECTED_OBJECTS.labels(
        "apiserver", "Service", "invalid_port")._value.get() - before == 1
