"""The stand-in apiserver (tests/support/fakeapiserver.py) in a lab namespace, holding the objects
the lab's manifest files hold: what the frontend reads from the files, a backend in local
mode lists and watches over the real protocol."""

from __future__ import annotations

import copy
from pathlib import Path

from tests.support.fakeapiserver import FakeApiserver, write_kubeconfig

from .manifests import Doc
from .netns import call_in

Key = tuple[str, str, str]  # kind, namespace, name
TOKEN = "lab-token"


def _key(doc: Doc) -> Key:
    meta = doc.get("metadata", {})
    return doc["kind"], meta.get("namespace", ""), meta["name"]


class LabApiserver:
    """Listens on 127.0.0.1 inside ``ns`` (reachable by processes in that namespace only);
    ``apply``/``delete`` take the same file names and documents as the manifest directory."""

    def __init__(self, ns: str, directory: Path) -> None:
        # Bound from a thread inside ``ns``: the listening socket belongs to that namespace.
        self.api: FakeApiserver = call_in(ns, lambda: FakeApiserver(token=TOKEN))
        self.kubeconfig = write_kubeconfig(directory / "kubeconfig", self.api.url, TOKEN)
        self._files: dict[str, dict[Key, Doc]] = {}

    def apply(self, filename: str, docs: list[Doc]) -> None:
        """Create, update and delete objects so the file's objects are exactly ``docs``."""
        old = self._files.get(filename, {})
        new = {_key(d): copy.deepcopy(d) for d in docs}
        for key, doc in new.items():
            if key not in old:
                self.api.create(key[0], doc)
            elif old[key] != doc:
                self.api.update(key[0], doc)
        for key in old.keys() - new.keys():
            self.api.delete(key[0], old[key])
        self._files[filename] = new

    def delete(self, filename: str) -> None:
        self.apply(filename, [])
        self._files.pop(filename, None)

    def close(self) -> None:
        self.api.close()
