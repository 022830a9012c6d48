"""The apiserver source: list and watch Services, EndpointSlices and Nodes into a sink.

Uses the official ``kubernetes`` client with ``--kubeconfig`` (its server replaced by
``--master`` when given), ``--master`` alone, or the in-cluster ServiceAccount. One daemon
thread per kind runs a reflector (see :mod:`.apiserver_reflector`); ``synced`` is set once
every kind has been listed.
"""

from __future__ import annotations

import threading
import time
from types import TracebackType

import kubernetes.client
from kubernetes.config.config_exception import ConfigException

from .apiserver_backoff import BackoffPolicy
from .apiserver_reflector import KindReflector, ReflectorOptions
from .apiserver_resources import RESOURCES
from .events import KINDS, Kind, Sink

__all__ = ["ApiserverConfigError", "ApiserverSource", "BackoffPolicy", "load_api_client"]


class ApiserverConfigError(RuntimeError):
    """No usable apiserver configuration (bad --kubeconfig, or not in a pod)."""


def load_api_client(kubeconfig: str | None, master: str = "") -> kubernetes.client.ApiClient:
    """An ApiClient from a kubeconfig file, or from the pod's ServiceAccount when None.

    ``master`` (kube-proxy's --master) is the apiserver's address: it replaces the
    kubeconfig's server, its credentials kept (clientcmd's ClusterInfo.Server override);
    without a kubeconfig it alone is the apiserver (no credentials, not in-cluster).
    urllib3's own retries are off: the reflectors retry with backoff and say so. Only the
    loader used is imported (the kubeconfig one brings requests-oauthlib and oauthlib).
    """
    configuration = kubernetes.client.Configuration()
    configuration.retries = 0
    if kubeconfig is not None:
        try:
            _load_kubeconfig(kubeconfig, master, configuration)
        except (ConfigException, OSError, ValueError) as exc:
            raise ApiserverConfigError(f"cannot use --kubeconfig {kubeconfig}: {exc}") from exc
    elif not master:
        from kubernetes.config.incluster_config import load_incluster_config

        try:
            load_incluster_config(client_configuration=configuration)
        except ConfigException as exc:
            raise ApiserverConfigError(
                f"no --kubeconfig given and no in-cluster configuration ({exc}); "
                "pass --kubeconfig PATH when running outside a pod"
            ) from exc
    else:
        configuration.host = _server(master, tls=False)
    return kubernetes.client.ApiClient(configuration)


def _server(master: str, tls: bool) -> str:
    """``master`` as a URL: given without a scheme (HOST[:PORT]) it is https when TLS is
    configured for it (a CA, a client certificate or insecure-skip-tls-verify), else http,
    as client-go's DefaultServerURL chooses."""
    if "://" not in master:
        master = f"{'https' if tls else 'http'}://{master}"
    return master.rstrip("/")


def _tls_configured(cluster: dict[str, object], user: dict[str, object]) -> bool:
    return any(cluster.get(key) for key in (
        "certificate-authority", "certificate-authority-data", "insecure-skip-tls-verify")) \
        or any(user.get(key) for key in ("client-certificate", "client-certificate-data"))


def _load_kubeconfig(path: str, master: str,
                     configuration: kubernetes.client.Configuration) -> None:
    """``configuration`` from the kubeconfig(s) at ``path`` (its current context), the
    current cluster's server replaced by ``master`` when given, before it is loaded: the
    loader reads the TLS files of an https server only, and its token refresh sets the
    server again on every request. With no current context, as clientcmd: ``master``
    alone, without credentials."""
    from kubernetes.config.kube_config import KubeConfigLoader, KubeConfigMerger

    merged = KubeConfigMerger(path).config
    if merged is None:
        raise ConfigException("Invalid kube-config file. No configuration found.")
    if master and not merged.safe_get("current-context"):
        configuration.host = _server(master, tls=False)
        return
    loader = KubeConfigLoader(merged, config_base_path=None)
    if master:
        context = loader.current_context["context"]
        cluster = merged["clusters"].get_with_name(context["cluster"])["cluster"].value
        user = context.get("user")
        found = merged["users"].get_with_name(user, safe=True) if user else None
        credentials = found["user"].value if found is not None else {}
        cluster["server"] = _server(master, _tls_configured(cluster, credentials))
    loader.load_and_set(configuration)


class ApiserverSource:
    """Streams the cluster's Services, EndpointSlices and Nodes into ``sink``."""

    def __init__(
        self,
        sink: Sink,
        *,
        kubeconfig: str | None = None,
        master: str = "",
        api_client: kubernetes.client.ApiClient | None = None,
        resync_backoff: BackoffPolicy | None = None,
        page_size: int = 500,
        watch_timeout_seconds: int = 300,
    ) -> None:
        self._owns_client = api_client is None
        self.api_client = (api_client if api_client is not None
                           else load_api_client(kubeconfig, master))
        self.synced = threading.Event()
        options = ReflectorOptions(
            page_size=page_size,
            watch_timeout_seconds=watch_timeout_seconds,
            backoff=resync_backoff or BackoffPolicy(),
        )
        self._listed: set[Kind] = set()
        self._lock = threading.Lock()
        self._reflectors = [
            KindReflector(RESOURCES[kind], self.api_client, sink, options, self._mark_listed)
            for kind in KINDS
        ]
        self._threads: list[threading.Thread] = []

    @property
    def server(self) -> str:
        """The apiserver URL in use."""
        return str(self.api_client.configuration.host)

    @property
    def resource_versions(self) -> dict[Kind, str | None]:
        """The last resourceVersion seen per kind (None while it must be listed)."""
        return {r.resource.kind: r.resource_version for r in self._reflectors}

    @property
    def failing_since(self) -> float | None:
        """Since when (monotonic) a kind has been failing to reach the apiserver, if any."""
        times = [r.failing_since for r in self._reflectors if r.failing_since is not None]
        return min(times) if times else None

    def start(self) -> None:
        """Start one daemon thread per kind."""
        for reflector in self._reflectors:
            thread = threading.Thread(
                target=reflector.run,
                name=f"apiserver-{reflector.resource.plural}",
                daemon=True,
            )
            thread.start()
            self._threads.append(thread)

    def stop(self, timeout: float = 5.0) -> None:
        """Stop watching; waits up to ``timeout`` seconds in all for the threads to end."""
        for reflector in self._reflectors:
            reflector.stop()
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        self._threads.clear()
        if self._owns_client:
            self.api_client.close()
            self.api_client.rest_client.close()

    def __enter__(self) -> ApiserverSource:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _mark_listed(self, kind: Kind) -> None:
        with self._lock:
            self._listed.add(kind)
            if len(self._listed) == len(KINDS):
                self.synced.set()
