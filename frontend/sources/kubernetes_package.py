"""The ``kubernetes`` client's package (and its ``config`` package), registered without
running their ``__init__``."""

from __future__ import annotations

import importlib.util
import sys


def bare_kubernetes_package() -> None:
    """Register the ``kubernetes`` package without running its ``__init__``, so that the
    frontend's ``import kubernetes.client`` (and ``.config``, ``.watch``) loads those
    subpackages only: the ``__init__`` also imports ``kubernetes.dynamic`` (with it
    kubernetes_validate and jsonschema), ``stream`` (websocket), ``leaderelection``,
    ``informer`` and ``utils``, which the frontend never uses: ~75 modules. The same for
    ``kubernetes.config``, whose ``__init__`` imports both the kubeconfig loader (with
    requests-oauthlib, oauthlib and requests) and the in-cluster one, where a start uses one
    of them. Nothing is done when the package is already imported."""
    if "kubernetes" in sys.modules:
        return
    for name in ("kubernetes", "kubernetes.config"):
        spec = importlib.util.find_spec(name)
        if spec is None or spec.submodule_search_locations is None:
            return
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        parent, _, child = name.rpartition(".")
        if parent:
            setattr(sys.modules[parent], child, module)
