"""Local mode: the frontend's computation in the backend's own process.

With no frontend address and a kubeconfig, a --master or in-cluster credentials, the
backend starts svcproxy's real frontend (``svcproxy.frontend.main.Frontend``: the apiserver
watch and the engine) on an event loop in a thread of its own, serving only a unix socket
in a private directory, and follows it through the SDK's client exactly as in split mode.
One DaemonSet then replaces kube-proxy without a frontend Deployment. kube-proxy's
``--master`` goes to the frontend's apiserver client (``load_api_client``).
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import threading
from concurrent.futures import Future, wait
from pathlib import Path
from typing import TYPE_CHECKING, Any

from svcproxy.loop_thread import LoopThread

if TYPE_CHECKING:
    from svcproxy.frontend.sources.apiserver_early import EarlySource

log = logging.getLogger(__name__)


class LocalFrontend:
    """``begin()`` starts the frontend without waiting (its imports, API server and the
    apiserver's listing then overlap the backend's own set-up); ``start()`` waits for it
    and returns the target to connect to; ``stop()`` undoes everything."""

    def __init__(self, kubeconfig: str | None, master: str = "") -> None:
        self.kubeconfig = kubeconfig
        self.master = master
        self._dir = Path(tempfile.mkdtemp(prefix="svcproxy-local-"))
        self.target = f"unix://{self._dir / 'api.sock'}"
        self._loop = LoopThread("svcproxy-local-frontend")
        self._frontend: Any = None
        self._started: Future[None] | None = None
        # Set once the apiserver's listing has started (or could not start early).
        self.listing_started = threading.Event()

    def begin(self) -> None:
        """Start the frontend on its thread (once); ``start`` waits for it."""
        if self._started is not None:
            return
        log.debug("Local mode: starting the frontend in process")
        self._loop.start()
        self._started = self._loop.submit(self._start())

    async def _start(self) -> None:
        try:
            listing = self._early_listing()
        finally:
            self.listing_started.set()
        from svcproxy.frontend.main import Frontend, FrontendOptions

        opts = FrontendOptions(listen=self.target, kubeconfig=self.kubeconfig,
                               master=self.master, metrics_bind_address="")
        self._frontend = Frontend(opts, listing)
        await self._frontend.start()

    def _early_listing(self) -> EarlySource | None:
        """The apiserver's listing started as ``svcproxy frontend`` starts it: before the
        rest of the frontend is imported (its requests are out meanwhile); None when the
        configuration is unusable (the frontend's start then says why)."""
        from svcproxy.frontend.sources.apiserver_early import start_listing

        try:
            return start_listing(self.kubeconfig, self.master)
        except Exception as err:  # noqa: BLE001 - said by the frontend's start
            log.debug("Local mode: listing not started early: %s", err)
            return None

    def start(self, timeout: float = 60.0) -> str:
        """Wait until the frontend serves its socket and watches the apiserver; raises
        what its start raised."""
        self.begin()
        assert self._started is not None
        self._started.result(timeout)
        log.info("Local mode: computing this node's state in process from the apiserver (%s)",
                 ", ".join(filter(None, (self.master, self.kubeconfig))) or "in-cluster config")
        return self.target

    def stop(self) -> None:
        if self._loop.running:
            if self._started is not None:
                wait([self._started], 60)
            if self._frontend is not None:
                try:
                    self._loop.call(self._frontend.stop(), 30)
                except Exception as err:  # noqa: BLE001 - a start that failed half-way
                    log.debug("Local mode: stopping the frontend: %s", err)
            self._loop.stop()
        shutil.rmtree(self._dir, ignore_errors=True)
