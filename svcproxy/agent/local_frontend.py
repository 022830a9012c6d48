"""Local mode: the frontend's computation in the backend's own process.

With no frontend address and a kubeconfig (or in-cluster credentials), the backend starts
svcproxy's real frontend (``svcproxy.frontend.main.Frontend``: the apiserver watch and the
engine) on an event loop in a thread of its own, serving only a unix socket in a private
directory, and follows it through the SDK's client exactly as in split mode. One DaemonSet
then replaces kube-proxy without a frontend Deployment. kube-proxy's ``--master`` replaces
the kubeconfig's server, or alone names the apiserver (no credentials), as kube-proxy's
client does.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import shutil
import tempfile
import threading
from concurrent.futures import Future, wait
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from svcproxy.loop_thread import LoopThread

if TYPE_CHECKING:
    from svcproxy.frontend.sources.apiserver_early import Listing

log = logging.getLogger(__name__)

# A kubeconfig's file references, read relative to the kubeconfig's own directory.
_CLUSTER_FILES = ("certificate-authority",)
_USER_FILES = ("client-certificate", "client-key", "tokenFile")


def _named(items: Any, name: object) -> dict[str, Any] | None:
    """The ``key`` body of the entry of ``items`` (a kubeconfig list) named ``name``."""
    for item in items if isinstance(items, list) else []:
        if isinstance(item, dict) and item.get("name") == name:
            return item
    return None


def _absolute(section: Any, fields: tuple[str, ...], base: Path) -> None:
    for field in fields if isinstance(section, dict) else ():
        value = section.get(field)
        if isinstance(value, str) and value and not os.path.isabs(value):
            section[field] = str(base / value)


def with_server(kubeconfig: dict[str, Any] | None, base: Path, server: str) -> dict[str, Any]:
    """``kubeconfig`` (None: none) with its current context's cluster at ``server``, as
    kube-proxy's --master overrides it (clientcmd's ClusterInfo.Server), its file
    references made absolute from ``base``. Without a current context, only the server."""
    config = copy.deepcopy(kubeconfig or {})
    context = _named(config.get("contexts"), config.get("current-context"))
    body = context.get("context") if context else None
    cluster = _named(config.get("clusters"), body.get("cluster")) if isinstance(body, dict) \
        else None
    if cluster is None or not isinstance(cluster.get("cluster"), dict):
        return {"apiVersion": "v1", "kind": "Config", "current-context": "master",
                "clusters": [{"name": "master", "cluster": {"server": server}}],
                "contexts": [{"name": "master", "context": {"cluster": "master"}}],
                "users": []}
    cluster["cluster"]["server"] = server
    for entry in config.get("clusters") or []:
        _absolute(entry.get("cluster") if isinstance(entry, dict) else None, _CLUSTER_FILES,
                  base)
    for entry in config.get("users") or []:
        _absolute(entry.get("user") if isinstance(entry, dict) else None, _USER_FILES, base)
    return config


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
            kubeconfig = self._kubeconfig()
            listing = self._early_listing(kubeconfig)
        finally:
            self.listing_started.set()
        from svcproxy.frontend.main import Frontend, FrontendOptions

        opts = FrontendOptions(listen=self.target, kubeconfig=kubeconfig,
                               in_cluster=kubeconfig is None, metrics_bind_address="")
        self._frontend = Frontend(opts, listing)
        await self._frontend.start()

    def _kubeconfig(self) -> str | None:
        """The kubeconfig the frontend reads: the given one, or with --master a copy in
        the private directory whose server is the master's."""
        if not self.master:
            return self.kubeconfig
        loaded = None
        if self.kubeconfig is not None:
            try:
                loaded = yaml.safe_load(Path(self.kubeconfig).read_text())
            except (OSError, yaml.YAMLError) as err:
                raise ValueError(f"cannot use --kubeconfig {self.kubeconfig}: "
                                 f"{str(err).splitlines()[0]}") from err
            if not isinstance(loaded, dict):
                raise ValueError(f"cannot use --kubeconfig {self.kubeconfig}: not a mapping")
        base = Path(self.kubeconfig or ".").resolve().parent
        path = self._dir / "kubeconfig"
        path.write_text(json.dumps(with_server(loaded, base, self.master)))
        return str(path)

    def _early_listing(self, kubeconfig: str | None) -> Listing | None:
        """The apiserver's listing started as ``svcproxy frontend`` starts it: before the
        rest of the frontend is imported (its requests are out meanwhile); None when the
        configuration is unusable (the frontend's start then says why)."""
        from svcproxy.frontend.sources.apiserver_early import start_listing

        try:
            return start_listing(kubeconfig)
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
