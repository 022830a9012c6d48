"""The C helpers (Maglev, CT GC) are loaded by one loader: a helper that is missing is
said once, with what does its work instead and how to build it."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from svcproxy.backends.ebpf import ct_gc_native, maglev_native, native_lib


def test_the_libraries_are_where_the_build_puts_them() -> None:
    assert maglev_native.LIBRARY == native_lib.NATIVE_DIR / "libsvcproxy_maglev.so"
    assert ct_gc_native.LIBRARY == native_lib.NATIVE_DIR / "libsvcproxy_ct_gc.so"


@pytest.mark.parametrize("module, cached, said", [
    (maglev_native, "_function", "Maglev tables are built in Python, about 30 times slower"),
    (ct_gc_native, "_library", "The CT GC runs in Python"),
])
def test_a_missing_helper_is_said_once_with_what_runs_instead(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, module: object,
        cached: str, said: str) -> None:
    monkeypatch.setattr(module, "LIBRARY", Path("/nonexistent/libsvcproxy_x.so"))
    getattr(module, cached).cache_clear()
    try:
        with caplog.at_level(logging.INFO, logger="svcproxy.backends.ebpf"):
            assert not module.available()  # type: ignore[attr-defined]
            assert not module.available()  # type: ignore[attr-defined]
        lines = [r.getMessage() for r in caplog.records if said in r.getMessage()]
        assert len(lines) == 1, caplog.text
        assert "/nonexistent/libsvcproxy_x.so" in lines[0]
        assert "python -m svcproxy.backends.ebpf.build builds the C helper" in lines[0]
    finally:
        monkeypatch.undo()
        getattr(module, cached).cache_clear()
