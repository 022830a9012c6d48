"""The manifest source: a directory of Kubernetes YAML, watched for changes.

Files hold Service, EndpointSlice and Node documents, or ``List`` documents as
``kubectl get -o yaml`` prints them. A file that does not parse is reported
(file, line, reason) and skipped as a whole: the objects it held before keep
their last good state. Changes are found by polling modification times.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from svcproxy.frontend import metrics
from svcproxy.frontend.events import KINDS, Event, Kind, Replace, Sink

log = logging.getLogger(__name__)
SUFFIXES = (".yaml", ".yml", ".json")


class ManifestError(ValueError):
    """A manifest file that cannot be used as a whole."""


@dataclass(frozen=True, slots=True)
class Fingerprint:
    mtime_ns: int
    size: int


def _documents(path: Path) -> list[dict[str, Any]]:
    """The objects of one file, with ``List`` documents flattened; raises ManifestError."""
    try:
        docs = list(yaml.safe_load_all(path.read_text()))
    except yaml.MarkedYAMLError as err:
        line = err.problem_mark.line + 1 if err.problem_mark else 0
        raise ManifestError(f"{path}:{line}: {err.problem}") from None
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as err:
        raise ManifestError(f"{path}: {err}") from None
    out: list[dict[str, Any]] = []
    for i, doc in enumerate(docs):
        if doc is None:
            continue
        if not isinstance(doc, dict):
            raise ManifestError(f"{path}: document {i + 1} is not a mapping")
        if str(doc.get("kind", "")).endswith("List"):
            items = doc.get("items") or []
            if not isinstance(items, list):
                raise ManifestError(f"{path}: document {i + 1}: items is not a list")
            out += [d for d in items if isinstance(d, dict)]
        else:
            out.append(doc)
    return out


def load_directory(directory: Path, last_good: dict[Path, list[dict[str, Any]]]
                   ) -> dict[Path, list[dict[str, Any]]]:
    """Objects per file; a broken file keeps the objects it had in ``last_good``."""
    out: dict[Path, list[dict[str, Any]]] = {}
    for path in sorted(p for p in directory.rglob("*") if p.suffix in SUFFIXES and p.is_file()):
        try:
            objs = _documents(path)
        except ManifestError as err:
            log.error("skipping manifest %s (its previous content stays in use)", err)
            metrics.INVALID_OBJECTS.labels("File").inc()
            if path in last_good:
                out[path] = last_good[path]
            continue
        for obj in objs:
            obj["__source__"] = str(path)
        out[path] = objs
    return out


def replace_events(files: dict[Path, list[dict[str, Any]]]) -> list[Event]:
    """One Replace per kind holding every object of that kind in the directory."""
    by_kind: dict[Kind, list[dict[str, Any]]] = {k: [] for k in KINDS}
    for objs in files.values():
        for obj in objs:
            kind = obj.get("kind")
            if kind in by_kind:
                by_kind[kind].append(obj)
    return [Replace(k, v) for k, v in by_kind.items()]


class ManifestSource:
    """Polls ``directory`` and sends the complete state whenever a file changes.

    The engine diffs what it receives against what it has, so only objects
    that really changed cause work downstream.
    """

    def __init__(self, directory: Path, sink: Sink, poll_interval: float = 0.2) -> None:
        self.directory = directory
        self.sink = sink
        self.poll_interval = poll_interval
        self._files: dict[Path, list[dict[str, Any]]] = {}
        self._seen: dict[Path, Fingerprint] | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="manifests", daemon=True)

    def _fingerprints(self) -> dict[Path, Fingerprint]:
        out = {}
        for path in self.directory.rglob("*"):
            if path.suffix in SUFFIXES:
                try:
                    st = path.stat()
                except OSError:
                    continue
                out[path] = Fingerprint(st.st_mtime_ns, st.st_size)
        return out

    def poll(self) -> bool:
        """Load the directory if anything changed; True when events were sent."""
        seen = self._fingerprints()
        if seen == self._seen:
            return False
        self._seen = seen
        self._files = load_directory(self.directory, self._files)
        self.sink(replace_events(self._files))
        return True

    def start(self) -> None:
        if not self.directory.is_dir():
            raise FileNotFoundError(f"manifest directory {self.directory} does not exist")
        self.poll()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self.poll_interval):
            try:
                self.poll()
            except Exception:
                log.exception("reading %s failed; will retry", self.directory)
