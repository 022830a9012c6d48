"""Sources: the adapters that read the cluster (the apiserver, a manifest directory or an
upstream frontend) and the events they send; the intake (``frontend/intake``) validates
each object before the store keeps it.

Every import of the kubernetes client in the frontend (its sources, the TokenReview
check) comes after this package's: the client's package is registered here without its
``__init__`` (see :mod:`.kubernetes_package`), for ``svcproxy frontend`` and local mode
alike."""

from .kubernetes_package import bare_kubernetes_package

bare_kubernetes_package()
