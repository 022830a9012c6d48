"""What every backend shares on the node: sync runner, health, metrics, conntrack.

``cli`` (flags, NodeConfig, run_agent) wires ``node_agent.NodeAgent``:
``runner`` (when to call Backend.sync), ``health`` + ``healthz`` (/healthz, /livez),
``metrics`` + ``metrics_server`` (kubeproxy_* on /metrics), ``service_health``
(health-check node ports), ``conntrack`` (pure: what to delete) + ``conntrack_cli``.
``addresses`` discovers the node's IPs; ``svcproxy.sdk.testing.FakeSource`` lets
backend authors test their backend under the real runner without a frontend.
"""
