"""Certificates rotate without a restart: the frontend re-reads its certificate, key and
client CA when the files change, the SDK its own on reconnect; open streams continue."""

from __future__ import annotations

import shutil
from pathlib import Path

import grpc

from svcproxy.frontend.serving.access.auth import AuthConfig
from svcproxy.frontend.serving.server import TLSFiles
from svcproxy.frontend.sources.events import Upsert
from svcproxy.sdk.client import NodeStateClient
from svcproxy.sdk.credentials import ClientTLS
from svcproxy.v1 import nodestate_pb2 as pb
from svcproxy.v1 import nodestate_pb2_grpc as pb_grpc
from tests.support.examples import WEB, copy_examples, web_slice
from tests.support.pki import CA, Issued
from tests.support.waiting import wait_for


def install(src: Issued, dst: Issued) -> None:
    """Replace files as Kubernetes updates a mounted Secret: a new file, renamed in."""
    for a, b in ((src.cert, dst.cert), (src.key, dst.key)):
        tmp = b.with_suffix(".new")
        shutil.copy(a, tmp)
        tmp.replace(b)


def write(path: Path, *cas: CA) -> None:
    tmp = path.with_suffix(".new")
    tmp.write_bytes(b"".join(ca.file.read_bytes() for ca in cas))
    tmp.replace(path)


def get_node_state(target: str, creds: grpc.ChannelCredentials) -> grpc.StatusCode:
    with grpc.secure_channel(target, creds) as channel:
        try:
            pb_grpc.NodeStateServiceStub(channel).GetNodeState(
                pb.GetNodeStateRequest(node_name="node-a"), timeout=5)
        except grpc.RpcError as err:
            return err.code()
    return grpc.StatusCode.OK


def test_server_and_client_certificates_rotate_under_open_streams(  # type: ignore[no-untyped-def]
        frontend_factory, tmp_path: Path) -> None:
    old, new = CA(tmp_path, "old-ca"), CA(tmp_path, "new-ca")
    live = tmp_path / "live"
    live.mkdir()
    server = Issued(live / "server.crt", live / "server.key")
    client = Issued(live / "client.crt", live / "client.key")
    server_ca, client_ca = live / "client-ca.crt", live / "trusted.crt"
    install(old.issue("server-old", "frontend", server=True), server)
    install(old.issue("node-a-old", "system:node:node-a", ("system:nodes",)), client)
    write(server_ca, old)
    write(client_ca, old, new)  # the node trusts both while the frontend moves
    fe = frontend_factory(copy_examples(tmp_path), listen="localhost:0",
                          tls=TLSFiles(server.cert, server.key, server_ca),
                          auth=AuthConfig(client_certs=True))
    target = f"localhost:{fe.frontend.port}"
    creds = ClientTLS(client_ca, client.cert, client.key)
    sdk = NodeStateClient(target, "node-a", credentials=creds, max_backoff=0.2)
    sdk.start()
    try:
        seen = Seen(sdk)
        wait_for(lambda: seen.endpoints() > 0, timeout=10)
        old_pair = old.issue("node-a-kept", "system:node:node-a", ("system:nodes",))

        install(new.issue("server-new", "frontend", server=True), server)
        write(server_ca, new)
        only_new = grpc.ssl_channel_credentials(new.file.read_bytes(),
                                                *new.issue("n", "system:node:node-a",
                                                           ("system:nodes",)).pem())
        # New connections: the new server certificate (trusted by the new CA alone)...
        assert get_node_state(target, only_new) == grpc.StatusCode.OK
        # ...and the new client CA: a certificate of the old one is refused.
        old_client = grpc.ssl_channel_credentials(client_ca.read_bytes(), *old_pair.pem())
        assert get_node_state(target, old_client) == grpc.StatusCode.UNAVAILABLE
        # The open stream goes on.
        fe.submit([Upsert("EndpointSlice", web_slice(3))])
        wait_for(lambda: seen.endpoints() == 3, timeout=10)
        assert sdk.resets == 0

        # The node's certificate rotates too; its next connection uses it.
        install(new.issue("node-a-new", "system:node:node-a", ("system:nodes",)), client)
        assert sdk._call is not None
        sdk._call.cancel()  # the stream breaks (as when the frontend restarts)
        fe.submit([Upsert("EndpointSlice", web_slice(4))])
        wait_for(lambda: seen.endpoints() == 4, timeout=10)
    finally:
        sdk.stop()


class Seen:
    """What the SDK client holds, taken as a backend would take it."""

    def __init__(self, sdk: NodeStateClient) -> None:
        self.sdk = sdk
        self.last: dict = {}

    def endpoints(self) -> int:
        taken = self.sdk.take()
        if taken is not None:
            self.last = {k: v.endpoints for k, v in taken[0].services.items()}
        return len(self.last.get(WEB, ()))
