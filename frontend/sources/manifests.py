"""The manifest source: a directory of Kubernetes YAML, watched for changes.

Files hold Service, EndpointSlice and Node documents, or ``List`` documents as
``kubectl get -o yaml`` prints them. Hostile content stays where it is:

- a file that does not parse (broken YAML syntax: where the next document starts is
  unknown) or is over the size limit is reported (file, line, reason) and skipped as a
  whole: the objects it held before keep their last good state;
- a document that parses but cannot be built (an unknown tag, bad ``!!binary``, a
  date such as 2026-13-45) or is over a limit (the nodes YAML aliases add, the
  nesting depth), and a document or item that is not an object of a kind svcproxy
  reads, is refused alone: the rest of the file goes on (objects are then validated
  by the engine's intake);
- sizes are bounded: the file, the nodes YAML aliases add, the nesting depth.

Changes arrive through inotify: a file is read once its writer has closed it
(IN_CLOSE_WRITE) or renamed it into place (IN_MOVED_TO), never half-written, within
milliseconds of the edit. A reading is kept only if no write to the file began after the
close it follows: an IN_MODIFY after that close (the next writer's truncation or first
write, queued by the kernel before the reading ends) drops it, and that writer's own
close reads the file again. Where inotify is unavailable the directory is polled, and
a changed file is read once it has stopped changing for one poll interval.
Hidden names (``.x``, and the ``..data`` links of a ConfigMap volume) are not read;
an event on one rescans the directory, so a ConfigMap update is seen.
"""

from __future__ import annotations

import ctypes
import functools
import itertools
import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import yaml

from svcproxy.frontend.edge.limits import KUBERNETES_MAX_DEPTH, allow_kubernetes_depth, deep_message
from svcproxy.frontend.edge.verdict import Problem
from svcproxy.frontend.runtime import metrics
from svcproxy.frontend.sources.events import KINDS, Delete, Event, Replace, Sink, Upsert

log = logging.getLogger(__name__)
# Where every refused object and file is logged (intake.py's logger).
refusals_log = logging.getLogger("svcproxy.frontend.engine")
SUFFIXES = (".yaml", ".yml", ".json")
API_VERSIONS = {"Service": "v1", "Node": "v1", "EndpointSlice": "discovery.k8s.io/v1"}
SOURCE = "manifests"
_READINGS = itertools.count(1)  # load_file's readings, numbered
Obj = dict[str, Any]
Key = tuple[str, str, str]


class ManifestError(ValueError):
    """A manifest file that cannot be used as a whole."""


class Rewritten(Exception):
    """A write to the file began after the close its reading follows: the text read may
    be the next writer's, half-written."""


@dataclass(frozen=True, slots=True)
class ManifestLimits:
    """Bounds on one manifest file; each has a ``svcproxy frontend`` flag."""

    max_file_bytes: int = 16 * 1024 * 1024
    max_alias_expansion: int = 100_000  # nodes YAML aliases may add to one document
    max_depth: int = KUBERNETES_MAX_DEPTH  # levels of maps and lists below the document


DEFAULT_MANIFEST_LIMITS = ManifestLimits()


@dataclass(frozen=True, slots=True)
class Fingerprint:
    mtime_ns: int
    size: int
    inode: int


_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
# libyaml refuses a file nesting deeper than 1,000 levels (a syntax error: the whole file
# is refused); raised to twice what Kubernetes takes, so a document deeper than that
# limit is refused alone, by _graph_problem, naming --max-object-depth.
YAML_NESTING_LIMIT = 2 * (KUBERNETES_MAX_DEPTH + 1)


@functools.cache
def _allow_deep_yaml() -> bool:
    """Raise libyaml's nesting limit (yaml_set_max_nest_level, libyaml 0.2.5+, a
    process-wide setting of the copy PyYAML's C extension holds); False when this
    PyYAML has no such libyaml (its 1,000 levels then stand, documented in
    docs/edge-fields.md). Python's recursion limit too (comparing documents)."""
    allow_kubernetes_depth()
    module = getattr(yaml, "_yaml", None)
    try:
        setter = ctypes.CDLL(module.__file__).yaml_set_max_nest_level  # type: ignore[union-attr]
    except (AttributeError, OSError, TypeError):
        log.warning("libyaml's nesting limit cannot be raised: manifests nested deeper "
                    "than 1,000 levels are refused whole")
        return False
    setter.argtypes, setter.restype = [ctypes.c_int], None
    setter(YAML_NESTING_LIMIT)
    return True


def refuse_file(source: str, where: str, problem: Problem | str) -> None:
    """Count and log a manifest file (or document) that yields no object."""
    reason = problem.reason if isinstance(problem, Problem) else "unparsable"
    metrics.REJECTED_OBJECTS.labels(source, "File", reason).inc()
    refusals_log.error("skipping %s: %s", where, problem)


class _Refused(Exception):
    def __init__(self, problem: Problem) -> None:
        self.problem = problem


def _graph_problem(root: yaml.Node, limits: ManifestLimits) -> Problem | None:
    """Why a document must not be built (its aliases expand too much, it nests too deep
    or it refers to itself), found before anything is built from it; None if it may.
    Maps and lists count for the depth, as in JSON (a scalar is no level), an alias's
    node as deep as where it is used. A loop over a stack of open nodes, so any depth
    the limit allows is walked."""
    expanded: dict[int, tuple[int, int]] = {}  # a node's expanded size and height
    active: set[int] = set()
    stack: list[list[Any]] = []  # [node, depth, its parts left, nodes so far, height]

    def enter(node: yaml.Node, depth: int) -> tuple[int, int] | None:
        """The expanded size and height of ``node`` when known now, else None (pushed
        to walk)."""
        hit = expanded.get(id(node))
        if not isinstance(node, yaml.SequenceNode | yaml.MappingNode):
            expanded[id(node)] = 1, -1  # a scalar, once: what aliases add is counted
            return 1, -1
        if depth + (hit[1] if hit is not None else 0) > limits.max_depth:
            raise _Refused(Problem("", "too_deep", deep_message(limits.max_depth)))
        if hit is not None:
            return hit
        if id(node) in active:
            raise _Refused(Problem("", "malformed", "a YAML alias refers to the node that "
                                   "holds it"))
        active.add(id(node))
        parts = itertools.chain.from_iterable(
            child if isinstance(child, tuple) else (child,) for child in node.value)
        stack.append([node, depth, parts, 1, 0])
        return None

    def add(frame: list[Any], count: int, height: int) -> None:
        frame[3] += count
        frame[4] = max(frame[4], height + 1)
        if frame[3] - len(expanded) > limits.max_alias_expansion:
            raise _Refused(Problem(
                "", "too_large", "YAML aliases expand it by more than "
                f"{limits.max_alias_expansion} nodes (--manifest-max-alias-"
                "expansion); write the objects out instead"))

    try:
        enter(root, 0)
        while stack:
            frame = stack[-1]
            part = next(frame[2], None)
            if part is None:
                stack.pop()
                active.discard(id(frame[0]))
                expanded[id(frame[0])] = frame[3], frame[4]
                if stack:
                    add(stack[-1], frame[3], frame[4])
                continue
            known = enter(part, frame[1] + 1)
            if known is not None:
                add(frame, *known)
    except _Refused as refused:
        return refused.problem
    return None


def _build(loader: Any, node: yaml.Node) -> Any:
    """The document of ``node``, or a Problem when a value in it cannot be built (an
    unknown tag, bad !!binary, a date that does not exist, an unhashable key...); the
    loader is then made ready for the next document."""
    try:
        return loader.construct_document(node)
    except (yaml.constructor.ConstructorError, ValueError, TypeError, OverflowError) as err:
        # What a failed construction left (objects, pending generators) would leak
        # into the next document: the constructor's own start state again.
        yaml.constructor.SafeConstructor.__init__(loader)
        mark = getattr(err, "problem_mark", None) or node.start_mark
        problem = getattr(err, "problem", None) or f"{type(err).__name__}: {err}"
        return Problem("", "unparsable", f"line {mark.line + 1}: cannot be built: "
                       f"{problem[:200]}")


def _read_text(path: Path, limits: ManifestLimits) -> str:
    try:
        with path.open("rb") as f:
            data = f.read(limits.max_file_bytes + 1)
    except OSError as err:
        raise ManifestError(f"{path}: {err.strerror or err}") from None
    if len(data) > limits.max_file_bytes:
        raise ManifestError(f"{path}: larger than {limits.max_file_bytes} bytes "
                            "(--manifest-max-file-bytes); split it into several files")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ManifestError(f"{path}: not UTF-8 text (byte {err.start})") from None


def parse_documents(path: Path, limits: ManifestLimits = DEFAULT_MANIFEST_LIMITS) -> list[Any]:
    """The YAML documents of one file, each checked before it is built: a document that
    must not or cannot be built is a Problem in its place. Raises ManifestError when the
    file as a whole cannot be used (not text, too large, broken YAML syntax)."""
    return parse_text(path, _read_text(path, limits), limits)


def parse_text(path: Path, text: str, limits: ManifestLimits) -> list[Any]:
    """``parse_documents`` of the text read from ``path``."""
    _allow_deep_yaml()
    loader = _Loader(text)
    docs: list[Any] = []
    try:
        while loader.check_node():
            node = loader.get_node()
            problem = _graph_problem(node, limits)
            docs.append(problem if problem is not None else _build(loader, node))
    except yaml.MarkedYAMLError as err:
        line = err.problem_mark.line + 1 if err.problem_mark else 0
        raise ManifestError(f"{path}:{line}: {err.problem}") from None
    except (yaml.YAMLError, RecursionError, ValueError, TypeError) as err:
        raise ManifestError(f"{path}: {type(err).__name__}: {err}") from None
    finally:
        loader.dispose()
    return docs


def _object_or_refusal(doc: Any, where: str) -> Obj | Problem:
    if not isinstance(doc, dict):
        return Problem("", "malformed", f"is a {type(doc).__name__}, not an object")
    kind = doc.get("kind")
    if not isinstance(kind, str):
        return Problem("kind", "malformed", f"{kind!r:.60} is not a kind")
    if kind not in KINDS:
        return Problem("kind", "unsupported_kind", f"{kind[:60]!r} is not a kind svcproxy reads "
                       "(Service, EndpointSlice, Node or a List of them)")
    version = doc.get("apiVersion")
    if version is not None and version != API_VERSIONS[kind]:
        return Problem("apiVersion", "unsupported_version", f"{version!r:.60} is not "
                       f"{API_VERSIONS[kind]} for a {kind}")
    return {**doc, "__source__": where}


def objects_of(path: Path, docs: list[Any]) -> list[Obj]:
    """The usable objects of a file's documents (Lists flattened); anything else is
    refused alone, logged and counted."""
    out: list[Obj] = []
    candidates: list[tuple[str, Any]] = []
    for i, doc in enumerate(docs):
        where = f"{path} (document {i + 1})"
        if doc is None:
            continue
        if isinstance(doc, Problem):
            refuse_file(SOURCE, where, doc)
            continue
        kind = doc.get("kind") if isinstance(doc, dict) else None
        if isinstance(kind, str) and kind.endswith("List") and kind not in KINDS:
            items = doc.get("items")
            if not isinstance(items, list | None):
                refuse_file(SOURCE, where, Problem("items", "malformed", "is not a list"))
                continue
            candidates += [(f"{path} (document {i + 1}, item {j + 1})", item)
                           for j, item in enumerate(items or [])]
        else:
            candidates.append((where, doc))
    for where, doc in candidates:
        got = _object_or_refusal(doc, where)
        if isinstance(got, Problem):
            refuse_file(SOURCE, where, got)
        else:
            out.append(got)
    return out


def load_file(path: Path, last_good: list[Obj] | None,
              limits: ManifestLimits = DEFAULT_MANIFEST_LIMITS,
              rewritten: Callable[[], bool] | None = None) -> list[Obj]:
    """The objects of one file; a broken file keeps ``last_good`` (reported, never raised).
    Each object read carries the number of this reading (the intake's memo says each
    refusal once per file version, named or not). ``rewritten``, asked once the text is
    read and before anything is parsed or reported, raises Rewritten when True."""
    try:
        text = _read_text(path, limits)
        if rewritten is not None and rewritten():
            raise Rewritten(str(path))
        objs = objects_of(path, parse_text(path, text, limits))
        reading = next(_READINGS)
        for obj in objs:
            obj["__read__"] = reading
        return objs
    except ManifestError as err:
        kept = " (its previous content stays in use)" if last_good else ""
        refuse_file(SOURCE, f"manifest {err}{kept}", Problem("", "unparsable", "unusable"))
        return last_good or []


def object_key(obj: Obj) -> Key:
    """(kind, namespace, name) of a manifest object."""
    kind = str(obj.get("kind", ""))
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        meta = {}
    ns = meta.get("namespace") if kind != "Node" else ""
    name = meta.get("name")
    return (kind, ns if isinstance(ns, str) and ns else ("" if kind == "Node" else "default"),
            name if isinstance(name, str) else "")


def replace_events(files: dict[Path, list[Obj]]) -> list[Event]:
    """One Replace per kind holding every object of that kind in the directory."""
    by_kind: dict[str, list[Obj]] = {k: [] for k in KINDS}
    for objs in files.values():
        for obj in objs:
            by_kind[obj["kind"]].append(obj)
    return [Replace(k, v) for k, v in by_kind.items()]  # type: ignore[arg-type]


def _visible(path: Path, root: Path) -> bool:
    return not any(part.startswith(".") for part in path.relative_to(root).parts)


class ManifestSource:
    """Watches ``directory`` and sends what changed; ``start()``, ``stop()``.

    The first load sends every object (a Replace per kind); later, only the objects
    of changed files are sent, so an edit costs the size of the file, not of the
    directory. The engine diffs what it receives against what it has.
    """

    def __init__(self, directory: Path, sink: Sink, poll_interval: float = 0.2,
                 limits: ManifestLimits = DEFAULT_MANIFEST_LIMITS,
                 use_inotify: bool = True) -> None:
        self.directory = directory
        self.sink = sink
        self.poll_interval = poll_interval
        self.limits = limits
        self.use_inotify = use_inotify
        self.mode = "poll"
        self._files: dict[Path, list[Obj]] = {}
        self._owners: dict[Key, int] = {}
        self._seen: dict[Path, Fingerprint] | None = None
        self._settling: dict[Path, Fingerprint] = {}
        self._inotify: Any = None
        self._watches: dict[int, Path] = {}
        # Events read while checking a reading (Rewritten), handled before the next read.
        self._backlog: list[Any] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="manifests", daemon=True)

    # ---- files -----------------------------------------------------------------------
    def _fingerprints(self) -> dict[Path, Fingerprint]:
        out = {}
        for path in self.directory.rglob("*"):
            if path.suffix in SUFFIXES and _visible(path, self.directory):
                try:
                    st = path.stat()
                except OSError:
                    continue
                if path.is_file():
                    out[path] = Fingerprint(st.st_mtime_ns, st.st_size, st.st_ino)
        return out

    def _account(self, objs: Iterable[Obj], step: int) -> None:
        for obj in objs:
            key = object_key(obj)
            count = self._owners.get(key, 0) + step
            if count > 0:
                self._owners[key] = count
            else:
                self._owners.pop(key, None)

    def apply(self, changed: Iterable[Path], removed: Iterable[Path],
              rewritten: Callable[[Path], bool] | None = None) -> bool:
        """Re-read ``changed``, forget ``removed`` and send what that changed. A file
        ``rewritten`` says a write began on since its close keeps its previous reading
        (its writer's close brings it again)."""
        changed, removed = sorted(set(changed)), set(removed) - set(changed)
        if not changed and not removed:
            return False
        before: set[Key] = set()
        for path in (*changed, *removed):
            old = self._files.pop(path, None)
            if old is not None:
                before |= {object_key(o) for o in old}
                self._account(old, -1)
                if path in changed:
                    self._files[path] = old
        read = []
        for path in changed:
            check = None if rewritten is None else partial(rewritten, path)
            try:
                objs = load_file(path, self._files.get(path), self.limits, check)
            except Rewritten:
                self._account(self._files.get(path, ()), +1)
                if self._seen is not None:
                    self._seen.pop(path, None)  # a rescan reads it again too
                continue
            read.append(path)
            self._files[path] = objs
            self._account(objs, +1)
        events: list[Event] = [Upsert(o["kind"], o) for p in read for o in self._files[p]]
        events += [Delete(kind, ns, name) for kind, ns, name in sorted(before)  # type: ignore
                   if (kind, ns, name) not in self._owners]
        if events:
            self.sink(events)
        return True

    def load_all(self) -> None:
        """The first load: every file, then a Replace per kind."""
        self._seen = self._fingerprints()
        for path in sorted(self._seen):
            self._files[path] = load_file(path, None, self.limits)
            self._account(self._files[path], +1)
        self.sink(replace_events(self._files))

    def rescan(self, settle: bool = False,
               rewritten: Callable[[Path], bool] | None = None) -> bool:
        """Compare the directory with what was read; with ``settle`` a changed file is
        read only once its fingerprint held still for one call (polling)."""
        seen = self._fingerprints()
        old = self._seen or {}
        changed = {p for p, fp in seen.items() if old.get(p) != fp}
        removed = old.keys() - seen.keys()
        if settle:
            ready = {p for p in changed if self._settling.get(p) == seen[p]}
            self._settling = {p: seen[p] for p in changed - ready}
            changed = ready
        kept = {p: fp for p, fp in old.items() if p not in removed}
        self._seen = kept | {p: seen[p] for p in changed}
        return self.apply(changed, removed, rewritten)

    def poll(self) -> bool:
        """One polling step (the fallback without inotify); True when events were sent."""
        if self._seen is None:
            self.load_all()
            return True
        return self.rescan(settle=True)

    # ---- inotify ---------------------------------------------------------------------
    def _watch_tree(self) -> None:
        from inotify_simple import flags

        mask = (flags.CLOSE_WRITE | flags.MOVED_TO | flags.MOVED_FROM | flags.DELETE
                | flags.CREATE | flags.DELETE_SELF | flags.MODIFY)
        dirs = [self.directory] + [p for p in self.directory.rglob("*")
                                   if p.is_dir() and _visible(p, self.directory)]
        known = set(self._watches.values())
        for d in dirs:
            if d not in known:
                try:
                    self._watches[self._inotify.add_watch(str(d), mask)] = d
                except OSError as err:
                    log.warning("cannot watch %s (%s); it is rescanned on other events",
                                d, err)

    def _start_inotify(self) -> bool:
        if not self.use_inotify:
            return False
        try:
            from inotify_simple import INotify

            self._inotify = INotify()
            self._watch_tree()
        except (ImportError, OSError) as err:
            log.warning("inotify is unavailable (%s): polling %s every %.1f s instead",
                        err, self.directory, self.poll_interval)
            if self._inotify is not None:
                self._inotify.close()
            self._inotify = None
            return False
        return True

    def _handle(self, events: list[Any]) -> None:
        from inotify_simple import flags

        changed: set[Path] = set()
        removed: set[Path] = set()
        rescan = False
        for ev in events:
            if ev.mask & flags.Q_OVERFLOW:
                rescan = True
                continue
            if ev.mask & flags.IGNORED:
                self._watches.pop(ev.wd, None)
                continue
            base = self._watches.get(ev.wd)
            if base is None:
                continue
            path = base / ev.name if ev.name else base
            if ev.mask & (flags.ISDIR | flags.DELETE_SELF) or ev.name.startswith(".."):
                rescan = True
            elif ev.name.startswith(".") or path.suffix not in SUFFIXES:
                continue
            elif ev.mask & (flags.CLOSE_WRITE | flags.MOVED_TO):
                changed.add(path)
                removed.discard(path)
            elif ev.mask & flags.MODIFY:  # written since its last close: wait for the next
                changed.discard(path)
            elif ev.mask & (flags.DELETE | flags.MOVED_FROM):
                removed.add(path)
                changed.discard(path)
        if rescan:
            self._watch_tree()
            self.rescan(rewritten=self._written_since)
            return
        seen = self._seen if self._seen is not None else {}
        for path in changed:
            try:
                st = path.stat()
                seen[path] = Fingerprint(st.st_mtime_ns, st.st_size, st.st_ino)
            except OSError:
                removed.add(path)
        for path in removed - changed:
            seen.pop(path, None)
        self.apply(changed - removed, removed, self._written_since)

    def _written_since(self, path: Path) -> bool:
        """Whether a write to ``path`` began after the events handled last: the kernel
        queued an IN_MODIFY for it (read without waiting; kept for the next step)."""
        from inotify_simple import flags

        self._backlog += self._inotify.read(timeout=0)
        return any(ev.mask & flags.MODIFY and ev.name == path.name
                   and self._watches.get(ev.wd) == path.parent for ev in self._backlog)

    def step(self, timeout: float = 0.2) -> None:
        """One turn of the watch loop: wait up to ``timeout`` seconds for events (or one
        poll interval without inotify) and send what they changed."""
        if self._inotify is None:
            self._stop.wait(self.poll_interval)
            self.poll()
            return
        events, self._backlog = self._backlog, []
        events += self._inotify.read(timeout=0 if events else int(timeout * 1000))
        if events and not self._stop.is_set():
            self._handle(events)

    # ---- lifecycle -------------------------------------------------------------------
    def start(self, thread: bool = True) -> None:
        """Watch and load the directory, then follow it on a thread of its own (without
        ``thread``, whoever started it calls ``step``)."""
        if not self.directory.is_dir():
            raise FileNotFoundError(f"manifest directory {self.directory} does not exist")
        # Watch before the first read, so an edit made meanwhile is not missed.
        self.mode = "inotify" if self._start_inotify() else "poll"
        self.load_all()
        if thread:
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=2)
        if self._inotify is not None:
            self._inotify.close()
            self._inotify = None

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.step()
            except Exception:
                log.exception("reading %s failed; will retry", self.directory)
                self._stop.wait(self.poll_interval)
