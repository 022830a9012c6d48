"""The cyclic garbage collector around a cold start: ``svcproxy backend`` and ``svcproxy
frontend`` pause it as their command starts (``svcproxy.cli.main``), before their imports,
and resume it after their first sync (the node agent's, the frontend's engine's)."""

from __future__ import annotations

import gc
import threading

# The longest the collector stays paused for a first sync that does not come.
START_PAUSE_LIMIT = 120.0
_start_pause: threading.Timer | None = None


def pause_collector_for_start() -> None:
    """No cyclic collection from the process start to the first sync (or for at most
    START_PAUSE_LIMIT): what a cold start allocates (imports, the first state, in local
    mode the frontend's too) lives on, and the passes over it cost ~0.5 s of a backend's
    start at 10,000 services, ~0.1 s of the frontend's (~120 passes, over its imports and the
    pages listed before its engine exists). Nothing is done when the collector is
    already off."""
    global _start_pause
    if not gc.isenabled() or _start_pause is not None:
        return
    gc.disable()
    _start_pause = threading.Timer(START_PAUSE_LIMIT, resume_collector_after_start)
    _start_pause.daemon = True
    _start_pause.start()


def resume_collector_after_start() -> None:
    """After the first sync: the state loaded so far is frozen out of the collector
    (long-lived, next to no cycles) and collection resumes."""
    global _start_pause
    timer, _start_pause = _start_pause, None
    if timer is None:
        return
    timer.cancel()
    gc.freeze()
    gc.enable()
