"""TLS and mutual TLS on the API, with certificates made by openssl for the test."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import grpc
import pytest

from svcproxy.frontend.serving.access.auth import AuthConfig
from svcproxy.frontend.serving.server import TLSFiles
from svcproxy.sdk.client import NodeStateClient
from tests.support.examples import copy_examples
from tests.support.waiting import wait_for


def openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not shutil.which("openssl"):
        pytest.skip("openssl is not installed")
    d = tmp_path_factory.mktemp("pki")
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=ca",
            "-keyout", "ca.key", "-out", "ca.crt", cwd=d)
    for name in ("server", "client"):
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}",
                "-keyout", f"{name}.key", "-out", f"{name}.csr", cwd=d)
        (d / f"{name}.ext").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
                "-CAcreateserial", "-days", "1", "-extfile", f"{name}.ext",
                "-out", f"{name}.crt", cwd=d)
    return d


# The client certificate's CN=client reads every node as a cluster reader.
READER = AuthConfig(client_certs=True, cluster_readers=frozenset({"client"}))


def creds(pki: Path, client_cert: bool) -> grpc.ChannelCredentials:
    if client_cert:
        return grpc.ssl_channel_credentials((pki / "ca.crt").read_bytes(),
                                            (pki / "client.key").read_bytes(),
                                            (pki / "client.crt").read_bytes())
    return grpc.ssl_channel_credentials((pki / "ca.crt").read_bytes())


def synced(target: str, credentials: grpc.ChannelCredentials, timeout: float = 20) -> bool:
    """Whether a client with ``credentials`` gets node-a's state within ``timeout``."""
    client = NodeStateClient(target, "node-a", credentials=credentials, max_backoff=0.2)
    client.start()
    try:
        wait_for(client.has_changes, timeout=timeout)
        return True
    except AssertionError:
        return False
    finally:
        client.stop()


def test_tls(frontend_factory, tmp_path: Path, pki: Path) -> None:  # type: ignore[no-untyped-def]
    fe = frontend_factory(copy_examples(tmp_path), listen="localhost:0",
                          tls=TLSFiles(pki / "server.crt", pki / "server.key"))
    target = f"localhost:{fe.frontend.port}"
    assert synced(target, creds(pki, client_cert=False))


def test_mutual_tls_requires_a_client_certificate(frontend_factory, tmp_path: Path,
                                                  pki: Path) -> None:  # type: ignore[no-untyped-def]
    fe = frontend_factory(copy_examples(tmp_path), listen="localhost:0",
                          tls=TLSFiles(pki / "server.crt", pki / "server.key", pki / "ca.crt"),
                          auth=READER)
    target = f"localhost:{fe.frontend.port}"
    assert synced(target, creds(pki, client_cert=True))
    assert not synced(target, creds(pki, client_cert=False), timeout=3)  # refused


def test_chained_frontend_over_mutual_tls(frontend_factory, tmp_path: Path,
                                          pki: Path) -> None:  # type: ignore[no-untyped-def]
    from svcproxy.sdk.client import tls_credentials

    up = frontend_factory(copy_examples(tmp_path), listen="localhost:0",
                          tls=TLSFiles(pki / "server.crt", pki / "server.key", pki / "ca.crt"),
                          auth=READER)
    down = frontend_factory(None, upstream=f"localhost:{up.frontend.port}",
                            upstream_credentials=tls_credentials(
                                pki / "ca.crt", pki / "client.crt", pki / "client.key"))
    wait_for(down.engine.synced.is_set, timeout=20)
    # Only what the upstream proxies travels (not headless or ExternalName services).
    assert set(down.engine.computed.caches) == set(up.engine.computed.caches) != set()
