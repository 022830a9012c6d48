"""Server TLS whose certificate, key and client CA are re-read when their files change.

gRPC asks the fetcher before each new handshake; it answers with a new configuration
only when a file was replaced or rewritten (a stat of each, no read otherwise), so a
rotated Secret takes effect for new connections while existing streams continue.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import grpc

from svcproxy.sdk.credentials import Version, files_version

log = logging.getLogger(__name__)


class ServerCertificates:
    """The fetcher of ``grpc.dynamic_ssl_server_credentials`` over three PEM files."""

    def __init__(self, cert: Path, key: Path, client_ca: Path | None) -> None:
        self.paths = (cert, key, client_ca)
        self._lock = threading.Lock()
        self._version: Version = files_version(self.paths)
        self.reloads = 0

    def load(self) -> grpc.ServerCertificateConfiguration:
        cert, key, ca = self.paths
        return grpc.ssl_server_certificate_configuration(
            [(key.read_bytes(), cert.read_bytes())],
            root_certificates=ca.read_bytes() if ca else None)

    def __call__(self) -> grpc.ServerCertificateConfiguration | None:
        with self._lock:
            version = files_version(self.paths)
            if version == self._version:
                return None
            try:
                config = self.load()
            except (OSError, ValueError) as err:
                log.error("cannot reload the TLS files %s (%s); keeping the previous ones",
                          ", ".join(str(p) for p in self.paths if p), err)
                return None
            self._version = version
            self.reloads += 1
            log.info("TLS certificate files changed: new connections use them")
            return config


def dynamic_server_credentials(cert: Path, key: Path,
                               client_ca: Path | None) -> grpc.ServerCredentials:
    """TLS (mutual TLS with ``client_ca``) that follows the files as they rotate."""
    fetcher = ServerCertificates(cert, key, client_ca)
    return grpc.dynamic_ssl_server_credentials(
        fetcher.load(), fetcher, require_client_authentication=client_ca is not None)
