"""The ``kubernetes`` client's package, registered without running its ``__init__``."""

from __future__ import annotations

import importlib.util
import sys


def bare_kubernetes_package() -> None:
    """Register the ``kubernetes`` package without running its ``__init__``, so that the
    frontend's ``import kubernetes.client`` (and ``.config``, ``.watch``) loads those
    subpackages only: the ``__init__`` also imports ``kubernetes.dynamic`` (with it
    kubernetes_validate and jsonschema), ``stream`` (websocket), ``leaderelection``,
    ``informer`` and ``utils``, which the frontend never uses: ~75 modules. Nothing is
    done when the package is already imported."""
    if "kubernetes" in sys.modules:
        return
    spec = importlib.util.find_spec("kubernetes")
    if spec is not None and spec.submodule_search_locations is not None:
        sys.modules["kubernetes"] = importlib.util.module_from_spec(spec)
