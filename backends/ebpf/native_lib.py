"""Loading a C helper of ``native/`` (built by ``build.py``) with ctypes, or saying once
what does its work instead."""

from __future__ import annotations

import ctypes
import logging
from pathlib import Path

log = logging.getLogger(__name__)

NATIVE_DIR = Path(__file__).parent / "native"


def library_path(name: str) -> Path:
    """Where ``build.py`` puts the helper of ``native/<name>.c``."""
    return NATIVE_DIR / f"libsvcproxy_{name}.so"


def load(path: Path, instead: str) -> ctypes.CDLL | None:
    """The library at ``path``, or None when it cannot be loaded (missing, built for
    another machine), logged with ``instead``: what does its work without it."""
    try:
        return ctypes.CDLL(str(path))
    except OSError as err:
        log.info("%s (%s; python -m svcproxy.backends.ebpf.build builds the C helper with "
                 "cc)", instead, err)
        return None
