"""A frontend that does not answer: the SDK says what to check, and keeps retrying."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from svcproxy.sdk.client import NodeStateClient
from tests.support.examples import copy_examples
from tests.support.waiting import wait_for

HINT = "is the frontend running at"


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "svcproxy.sdk.client" and r.levelno == logging.WARNING]


def test_nothing_listening_asks_whether_the_frontend_runs_at_that_address(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    target = f"unix://{tmp_path / 'nobody.sock'}"
    client = NodeStateClient(target, "node-a", max_backoff=0.2)
    with caplog.at_level(logging.WARNING, "svcproxy.sdk.client"):
        client.start()
        try:
            wait_for(lambda: len(warnings(caplog)) >= 2, timeout=60)
        finally:
            client.stop()
    first = warnings(caplog)[0]
    assert f"{HINT} {target}?" in first
    assert "--api or $SVCPROXY_API" in first
    assert client.error is None  # retried, never given up


def test_a_live_stream_that_breaks_is_not_called_unreachable(
        frontend_factory, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    frontend = frontend_factory(copy_examples(tmp_path))
    client = NodeStateClient(frontend.opts.listen, "node-a", max_backoff=0.2)
    client.start()
    try:
        wait_for(client.has_changes, timeout=30)
        with caplog.at_level(logging.WARNING, "svcproxy.sdk.client"):
            frontend.stop()
            wait_for(lambda: len(warnings(caplog)) >= 2, timeout=60)
    finally:
        client.stop()
    broken, retried = warnings(caplog)[:2]
    assert HINT not in broken
    assert f"{HINT} {frontend.opts.listen}?" in retried
