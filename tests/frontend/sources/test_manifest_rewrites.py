"""The manifest source never serves a file that is being rewritten: a reading is kept only
if no write to the file began after the close it follows. Real files and inotify; the
source is stepped by the test (``start(thread=False)``) so that the writers' interleavings
are exact instead of left to the scheduler."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import IO

import pytest
import yaml

from svcproxy.frontend.sources import manifests
from svcproxy.frontend.sources.events import Event, Upsert
from svcproxy.frontend.sources.manifests import ManifestSource
from tests.support.hostile import endpoint_slice

SIZE = 40


def version(n: int) -> str:
    """The slice with SIZE endpoints 10.244.<n>.*, endpoints last (as people write)."""
    ips = tuple(f"10.244.{n}.{i + 1}" for i in range(SIZE))
    return yaml.safe_dump(endpoint_slice(ips=ips), sort_keys=False)


def first_half(text: str) -> str:
    """Whole lines up to the middle: a prefix that parses, with fewer endpoints."""
    return text[: text.index("\n", len(text) // 2) + 1]


class Served:
    """What the source sent for the slice after its first load (a Replace): (endpoint
    count, first address) per upsert."""

    def __init__(self) -> None:
        self.upserts: list[tuple[int, str]] = []

    def __call__(self, events: list[Event]) -> None:
        for e in events:
            if isinstance(e, Upsert):
                eps = e.obj["endpoints"]
                self.upserts.append((len(eps), eps[0]["addresses"][0]))


@pytest.fixture
def slice_file(tmp_path: Path) -> Path:
    path = tmp_path / "slice.yaml"
    path.write_text(version(0))
    return path


@pytest.fixture
def source(slice_file: Path) -> Iterator[tuple[ManifestSource, Served]]:
    served = Served()
    src = ManifestSource(slice_file.parent, served, poll_interval=3600)
    src.start(thread=False)
    assert src.mode == "inotify"
    try:
        yield src, served
    finally:
        src.stop()


def rewrite_half(path: Path, text: str) -> IO[str]:
    """The next writer: truncates ``path`` in place and writes half of ``text``, still open."""
    writer = path.open("w")
    writer.write(first_half(text))
    writer.flush()
    return writer


def test_a_close_followed_by_the_next_writers_truncation_is_not_read(
        source: tuple[ManifestSource, Served], slice_file: Path) -> None:
    src, served = source
    slice_file.write_text(version(1))  # written and closed
    writer = rewrite_half(slice_file, version(2))  # then rewritten in place, not closed yet
    src.step(timeout=5)  # sees the close and, after it, the truncation
    assert served.upserts == []  # nothing sent: the first load's version stays
    writer.write(version(2)[len(first_half(version(2))):])
    writer.close()
    src.step(timeout=5)
    assert served.upserts == [(SIZE, "10.244.2.1")]


def test_a_truncation_during_the_reading_drops_it(
        source: tuple[ManifestSource, Served], slice_file: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    src, served = source
    slice_file.write_text(version(1))  # written and closed: the close is all that is queued
    writers: list[IO[str]] = []
    real = manifests._read_text

    def racing(path: Path, limits: manifests.ManifestLimits) -> str:
        if not writers:  # the next writer truncates just as the source reads
            writers.append(rewrite_half(path, version(2)))
        return real(path, limits)

    monkeypatch.setattr(manifests, "_read_text", racing)
    src.step(timeout=5)
    assert writers, "the close was handled and the file read"
    assert served.upserts == []  # the half-written reading was dropped
    writers[0].write(version(2)[len(first_half(version(2))):])
    writers[0].close()
    src.step(timeout=5)
    assert served.upserts == [(SIZE, "10.244.2.1")]


def test_a_close_with_no_write_after_it_is_read_at_once(
        source: tuple[ManifestSource, Served], slice_file: Path) -> None:
    src, served = source
    slice_file.write_text(version(1))
    src.step(timeout=5)
    assert served.upserts == [(SIZE, "10.244.1.1")]
