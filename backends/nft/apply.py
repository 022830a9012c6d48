"""Load nft text into the kernel with one ``nft -f -`` transaction."""

from __future__ import annotations

import errno
import os
import subprocess
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

# How long nft may take to open the transaction's FIFO before it is given up on.
OPEN_TIMEOUT = 60.0


class Runner(Protocol):
    """Anything that applies nft text as one transaction (NftRunner, LibNftRunner)."""

    def apply(self, text: str) -> None: ...

    def check(self, text: str) -> None:
        """Send ``text`` to the kernel and abort it (``nft -c``): raise NftError if it
        would be refused, change nothing either way."""

    def list_sets(self, family: str) -> str:
        """``nft -j list sets FAMILY``: every set of the family, with its elements (JSON);
        raise NftError when it cannot be read."""


class NftError(RuntimeError):
    """``nft`` refused a transaction; nothing of it was applied."""


@dataclass(frozen=True, slots=True)
class NftRunner:
    """Runs ``nft``; ``prefix`` wraps it (e.g. ``ip netns exec NS``) for tests and tools."""

    prefix: Sequence[str] = ()
    nft: str = "nft"
    # Where apply_parts makes the directory of its FIFO (default: the temporary files').
    fifo_parent: str | None = None

    def apply(self, text: str) -> None:
        """Run ``text`` as one atomic transaction; raise NftError with nft's message."""
        if not text:
            return
        done = subprocess.run(
            [*self.prefix, self.nft, "-f", "-"], input=text.encode(), capture_output=True
        )
        if done.returncode != 0:
            raise NftError(summarize_error(done.stderr.decode(errors="replace"), text))

    def apply_parts(self, parts: Iterable[str]) -> str:
        """Run the text ``parts`` make as one transaction, ``nft`` reading it as it is
        made (from a FIFO: ``-f -`` reads the whole of stdin before parsing any of it), so
        nft parses on another core while the rest is made. Returns the whole text; raises
        NftError like ``apply``. When making a part raises, nft is killed before it could
        read an end of input: nothing of the transaction is applied."""
        written: list[str] = []
        with tempfile.TemporaryDirectory(prefix="svcproxy-nft-", dir=self.fifo_parent) as tmp, \
                tempfile.TemporaryFile() as err:
            fifo = Path(tmp) / "transaction.nft"
            os.mkfifo(fifo, 0o600)
            proc = subprocess.Popen([*self.prefix, self.nft, "-f", str(fifo)],
                                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                    stderr=err)
            try:
                fd = _open_writer(proc, fifo)
            except BaseException as e:
                proc.kill()
                proc.wait()
                if isinstance(e, NftError):  # nft exited (or hung) before reading: why
                    err.seek(0)
                    raise NftError(f"{e} (exit status {proc.returncode}): "
                                   f"{err.read().decode(errors='replace').strip()}") from None
                raise
            try:
                _feed(fd, parts, written)
            except BaseException:
                proc.kill()  # before its input ends: nft applies nothing
                proc.wait()
                raise
            finally:
                os.close(fd)  # nft's end of input
            text = "".join(written)
            if _wait(proc, fifo) != 0:
                err.seek(0)
                raise NftError(summarize_error(err.read().decode(errors="replace"), text))
        return text

    def check(self, text: str) -> None:
        """``nft -c -f -``: the kernel validates the transaction and aborts it."""
        done = subprocess.run(
            [*self.prefix, self.nft, "-c", "-f", "-"], input=text.encode(), capture_output=True
        )
        if done.returncode != 0:
            raise NftError(summarize_error(done.stderr.decode(errors="replace"), text))

    def list_sets(self, family: str) -> str:
        """``nft -j list sets FAMILY`` (JSON, elements included)."""
        done = subprocess.run([*self.prefix, self.nft, "-j", "list", "sets", family],
                              capture_output=True)
        if done.returncode != 0:
            raise NftError(done.stderr.decode(errors="replace").strip() or "nft list sets")
        return done.stdout.decode()

    def list_table(self, family: str, table: str) -> str:
        """``nft list table`` output, or "" when the table does not exist."""
        done = subprocess.run(
            [*self.prefix, self.nft, "list", "table", family, table], capture_output=True
        )
        return done.stdout.decode() if done.returncode == 0 else ""


def _feed(fd: int, parts: Iterable[str], written: list[str]) -> None:
    """Write ``parts`` to ``fd`` (each kept in ``written``); once the reader is gone (nft
    exits at the first error it reads), the rest is only kept."""
    reader = True
    for part in parts:
        written.append(part)
        data = memoryview(part.encode())
        while reader and data:
            try:
                data = data[os.write(fd, data):]
            except BrokenPipeError:
                reader = False


def _wait(proc: subprocess.Popen[bytes], fifo: Path) -> int:
    """nft's exit status. To quote the line of an error nft opens its input again, and
    a FIFO's opening waits for a writer: one that writes nothing is opened for it."""
    while True:
        try:
            return proc.wait(0.005)
        except subprocess.TimeoutExpired:
            try:
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
            except OSError as e:
                if e.errno != errno.ENXIO:  # ENXIO: nft is not opening it
                    raise


def _open_writer(proc: subprocess.Popen[bytes], fifo: Path) -> int:
    """The FIFO's write end once ``proc`` has opened it for reading; NftError when proc
    exits first or does not open it within OPEN_TIMEOUT."""
    deadline = time.monotonic() + OPEN_TIMEOUT
    delay = 0.0005
    while True:
        try:
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as e:
            if e.errno != errno.ENXIO:  # ENXIO: no reader yet
                raise
        else:
            os.set_blocking(fd, True)
            return fd
        if proc.poll() is not None or time.monotonic() > deadline:
            raise NftError("nft did not open the transaction's FIFO")
        time.sleep(delay)
        delay = min(delay * 2, 0.01)


def summarize_error(stderr: str, text: str, limit: int = 12) -> str:
    """nft's error lines (capped), or the start of the text when nft said nothing."""
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    if not lines:
        lines = ["nft failed without a message; transaction began:", *text.splitlines()[:5]]
    more = f"\n... ({len(lines) - limit} more lines)" if len(lines) > limit else ""
    return "\n".join(lines[:limit]) + more
