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
from svcproxy.frontend.events import KINDS, Delete, Event, Kind, Replace, Sink, Upsert

log = logging.getLogger(__name__)
SUFFIXES = (".yaml", ".yml", ".json")


class ManifestError(ValueError):
    """A manifest file that cannot be used as a whole."""


@dataclass(frozen=True, slots=True)
class Fingerprint:
    mtime_ns: int
    size: int


_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _documents(path: Path) -> list[dict[str, Any]]:
    """The objects of one file, with ``List`` documents flattened; raises ManifestError."""
    try:
        docs = list(yaml.load_all(path.read_text(), Loader=_Loader))
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
    for obj in out:
        obj["__source__"] = str(path)
    return out


def load_file(path: Path, last_good: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """The objects of one file; a broken file keeps ``last_good`` (reported, never raised)."""
    try:
        return _documents(path)
    except ManifestError as err:
        log.error("skipping manifest %s (its previous content stays in use)", err)
        metrics.INVALID_OBJECTS.labels("File").inc()
        return last_good or []


def object_key(obj: dict[str, Any]) -> tuple[str, str, str]:
    """(kind, namespace, name) of a manifest object."""
    kind = str(obj.get("kind", ""))
    meta = obj.get("metadata") if isinstance(obj.get("metadata"), dict) else {}
    ns = "" if kind == "Node" else str(meta.get("namespace") or "default")
    return kind, ns, str(meta.get("name") or "")


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
                if path.is_file():
                    out[path] = Fingerprint(st.st_mtime_ns, st.st_size)
        return out

    def poll(self) -> bool:
        """Re-read the files that changed; True when events were sent.

        The first load sends every object (a Replace per kind); later, only the
        objects of changed files are sent, so an edit costs the size of the file,
        not of the directory.
        """
        seen = self._fingerprints()
        if seen == self._seen:
            return False
        first = self._seen is None
        old = self._seen or {}
        changed = [p for p, fp in sorted(seen.items()) if old.get(p) != fp]
        removed = old.keys() - seen.keys()
        before = {object_key(o) for p in (*changed, *removed) for o in self._files.get(p, [])}
        for path in removed:
            self._files.pop(path, None)
        for path in changed:
            self._files[path] = load_file(path, self._files.get(path))
        self._seen = seen
        if first:
            self.sink(replace_events(self._files))
            return True
        present = {object_key(o) for objs in self._files.values() for o in objs}
        events: list[Event] = [Upsert(o["kind"], o) for p in changed for o in self._files[p]
                               if o.get("kind") in KINDS]
        events += [Delete(kind, ns, name) for kind, ns, name in sorted(before - present)
                   if kind in KINDS]
        self.sink(events)
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
