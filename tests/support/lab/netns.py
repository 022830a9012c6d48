"""Thin adapters over network namespaces: run ``ip``, run Python code inside one."""

from __future__ import annotations

import ctypes
import os
import subprocess
import threading
from collections.abc import Callable, Sequence
from typing import TypeVar

T = TypeVar("T")
CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


class LabError(RuntimeError):
    """A lab command failed."""


def run(argv: Sequence[str], check: bool = True, stdin: str | None = None,
        timeout: float | None = None) -> str:
    """Run a command, return its stdout; raise LabError with its stderr on failure (and
    subprocess.TimeoutExpired, having killed it, past ``timeout`` seconds)."""
    done = subprocess.run(
        list(argv), input=stdin.encode() if stdin else None, capture_output=True,
        timeout=timeout,
    )
    if check and done.returncode != 0:
        raise LabError(f"{' '.join(argv)}: {done.stderr.decode().strip()}")
    return done.stdout.decode()


def ip(ns: str, *args: str, check: bool = True) -> str:
    """``ip -n NS ARGS``."""
    return run(["ip", "-n", ns, *args], check=check)


def ns_exec(ns: str, *argv: str, check: bool = True, stdin: str | None = None,
            timeout: float | None = None) -> str:
    """Run a command inside a namespace."""
    return run(["ip", "netns", "exec", ns, *argv], check=check, stdin=stdin, timeout=timeout)


def _write(path: str, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def sysctl(ns: str, key: str, value: str) -> None:
    """Set a network sysctl inside ``ns`` (via /proc/sys, from a thread in ``ns``)."""
    call_in(ns, _write, "/proc/sys/" + key.replace(".", "/"), value)


def enter(ns: str) -> None:
    """Move the calling OS thread into namespace ``ns`` (threads only, never the main one)."""
    fd = os.open(f"/var/run/netns/{ns}", os.O_RDONLY)
    try:
        if _libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise LabError(f"setns {ns}: {os.strerror(err)}")
    finally:
        os.close(fd)


def call_in(ns: str, fn: Callable[..., T], *args: object) -> T:
    """Run ``fn(*args)`` in a fresh thread inside ``ns`` and return its result."""
    box: dict[str, object] = {}

    def target() -> None:
        try:
            enter(ns)
            box["result"] = fn(*args)
        except BaseException as err:  # noqa: BLE001 - re-raised in the caller
            box["error"] = err

    thread = threading.Thread(target=target, name=f"netns-{ns}", daemon=True)
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box["result"]  # type: ignore[return-value]
