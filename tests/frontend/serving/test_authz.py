"""The pure rules of who may read what, and the parsing at the edge, on hostile input."""

from __future__ import annotations

import string

from hypothesis import given
from hypothesis import strategies as st

from svcproxy.frontend.serving.access.auth import (
    ANONYMOUS_IDENTITY,
    Identity,
    bearer_token,
    check_listen,
    is_local,
)
from svcproxy.frontend.serving.access.authz import authorize
from tests.support.paths import REPO

names = st.text(string.ascii_lowercase + string.digits + "-.:", min_size=1, max_size=20)
methods = st.sampled_from(["Watch", "GetNodeState", "ListNodes", "WatchCluster"])
identities = st.builds(Identity, names, st.frozensets(names, max_size=3),
                       st.none() | names, st.sampled_from(["x509", "token"]))


@given(identities, methods, st.none() | names, st.frozensets(names, max_size=3))
def test_an_identity_reads_another_node_only_as_a_cluster_reader(
        identity: Identity, method: str, node: str | None, readers: frozenset[str]) -> None:
    allowed = authorize(identity, method, node, readers) is None
    reader = identity.name in readers or bool(identity.groups & readers)
    own = (method in ("Watch", "GetNodeState") and identity.node is not None
           and node == identity.node)
    assert allowed == (reader or own)


@given(identities, methods, st.none() | names)
def test_a_refusal_names_the_identity(identity: Identity, method: str,
                                      node: str | None) -> None:
    refusal = authorize(identity, method, node, frozenset())
    if refusal is not None:
        assert repr(identity.name) in refusal and method in refusal


def test_anonymous_reads_everything_where_it_is_accepted() -> None:
    impostor = Identity("system:anonymous", frozenset({"system:unauthenticated"}))
    for method in ("Watch", "GetNodeState", "ListNodes", "WatchCluster"):
        assert authorize(ANONYMOUS_IDENTITY, method, "node-b", frozenset()) is None
        # A certificate naming itself anonymous is an identity like any other.
        assert authorize(impostor, method, "node-b", frozenset()) is not None


@given(st.lists(st.tuples(st.text(max_size=20), st.text(max_size=40) | st.binary(max_size=40)),
                max_size=5))
def test_bearer_token_parsing_never_fails(metadata: list[tuple[str, str | bytes]]) -> None:
    try:
        token = bearer_token(metadata)
    except UnicodeDecodeError:
        return  # grpc hands binary values only for -bin keys, never for authorization
    assert token is None or (token and token == token.strip())


def test_bearer_token_forms() -> None:
    assert bearer_token([("authorization", "Bearer abc")]) == "abc"
    assert bearer_token([("authorization", "bearer  abc ")]) == "abc"
    assert bearer_token([("authorization", "Basic abc")]) is None
    assert bearer_token([("authorization", "Bearer ")]) is None


def test_where_anonymous_callers_are_accepted() -> None:
    assert is_local("unix:///run/x.sock") and is_local("127.0.0.1:1") and is_local("[::1]:1")
    assert is_local("localhost:1") and not is_local("0.0.0.0:1") and not is_local("10.0.0.1:1")
    assert check_listen("127.0.0.1:1", False, False, False, False)
    assert check_listen("0.0.0.0:1", False, False, False, True)
    assert not check_listen("0.0.0.0:1", True, True, False, False)
    for listen, tls, certs, tokens, why in (
            ("0.0.0.0:1", False, False, False, "anyone who reaches"),
            ("0.0.0.0:1", False, False, True, "plaintext"),
            ("0.0.0.0:1", True, True, True, "cannot share one port")):
        try:
            check_listen(listen, tls, certs, tokens, False)
        except ValueError as err:
            assert why in str(err)
        else:
            raise AssertionError(f"{listen} {tls} {certs} {tokens} was accepted")


def test_the_frontend_refuses_to_start_unauthenticated_off_loopback() -> None:
    import subprocess
    import sys

    def run(*flags: str) -> subprocess.CompletedProcess[str]:
        examples = REPO / "examples" / "cluster"
        return subprocess.run([sys.executable, "-m", "svcproxy.cli", "frontend", "--manifests",
                               str(examples), "--metrics-bind-address", "", *flags],
                              capture_output=True, text=True, timeout=60)

    refused = run("--listen", "0.0.0.0:0")
    assert refused.returncode != 0
    assert "refusing to start: anyone who reaches 0.0.0.0:0" in refused.stderr
    assert "--insecure-allow-anonymous" in refused.stderr
    plaintext = run("--listen", "0.0.0.0:0", "--token-audience", "svcproxy")
    assert plaintext.returncode != 0 and "in plaintext" in plaintext.stderr
