"""kube-proxy compatibility: its flags, its --config file (KubeProxyConfiguration), the
sysctls it sets for a mode, and the cleanup of what another mode left behind.

``cli.main`` runs ``svcproxy backend`` with kube-proxy's flags: it reads them (``flags``,
``config``), picks the backend for the mode and runs it under the SDK's node agent.
"""
