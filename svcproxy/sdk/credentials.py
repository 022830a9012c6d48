"""Credentials read from files and read again when the files change.

Kubernetes rotates what it mounts (a Secret's certificates, the kubelet's projected
ServiceAccount token) by replacing the files; a long-running client must pick the new
ones up without a restart. ``ClientTLS`` gives channel credentials made from the files
as they are now (the SDK asks on every reconnect); ``TokenFile`` gives the call
metadata (``authorization: Bearer ...``) with the token as it is now.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from pathlib import Path

import grpc

Version = tuple[tuple[int, int, int], ...]


def files_version(paths: Sequence[Path | None]) -> Version:
    """What changes when any of ``paths`` is replaced or rewritten (missing: zeros)."""
    out = []
    for path in paths:
        try:
            st = os.stat(path) if path else None
        except OSError:
            st = None
        out.append((st.st_ino, st.st_mtime_ns, st.st_size) if st else (0, 0, 0))
    return tuple(out)


class ClientTLS:
    """Client TLS from PEM files: a CA to trust, and a certificate and key for mutual TLS.

    ``credentials()`` re-reads the files when they have changed since the last call.
    """

    def __init__(self, ca: Path | None, cert: Path | None = None,
                 key: Path | None = None) -> None:
        if bool(cert) != bool(key):
            raise ValueError("a client certificate and its key go together")
        self.paths = (ca, cert, key)
        self._lock = threading.Lock()
        self._version: Version | None = None
        self._credentials: grpc.ChannelCredentials | None = None
        self.credentials()

    def credentials(self) -> grpc.ChannelCredentials:
        ca, cert, key = self.paths
        with self._lock:
            version = files_version(self.paths)
            if version != self._version or self._credentials is None:
                self._credentials = grpc.ssl_channel_credentials(
                    root_certificates=ca.read_bytes() if ca else None,
                    private_key=key.read_bytes() if key else None,
                    certificate_chain=cert.read_bytes() if cert else None)
                self._version = version
            return self._credentials


class TokenFile:
    """A bearer token file (a projected ServiceAccount token), re-read when it changes."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._version: Version | None = None
        self._token = ""
        self.metadata()

    def metadata(self) -> tuple[tuple[str, str], ...]:
        with self._lock:
            version = files_version([self.path])
            if version != self._version:
                token = self.path.read_text().strip()
                if not token:
                    raise ValueError(f"the token file {self.path} is empty")
                self._token, self._version = token, version
            return (("authorization", f"Bearer {self._token}"),)
