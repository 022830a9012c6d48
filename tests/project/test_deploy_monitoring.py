"""deploy/'s Grafana dashboard and Prometheus alerts use only metrics that are exported:
every name in their expressions is a series of the frontend's /metrics or of an agent's."""

from __future__ import annotations

import json
import re

import yaml
from prometheus_client import REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

import svcproxy.frontend.main  # noqa: F401 - every frontend metric is made on import
from svcproxy.sdk.backend import Backend, Changes, NodeState
from svcproxy.sdk.metrics import AgentMetrics
from tests.support.paths import REPO

DEPLOY = REPO / "deploy"
NAME = re.compile(r"\b(?:svcproxy|kubeproxy)_[a-z0-9_]+\b")
SUFFIXES = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_sum", "_count"),
            "summary": ("_sum", "_count"), "gauge": ("",), "info": ("_info",),
            "unknown": ("",)}


class Backend_(Backend):
    name = "nft"

    def sync(self, state: NodeState, changes: Changes) -> None:
        pass


def series(registry: CollectorRegistry) -> set[str]:
    """The series names a registry exports (labelled ones with no child yet included)."""
    out = set()
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        out |= {family.name + suffix for suffix in SUFFIXES[family.type]}
    return out


def exported() -> set[str]:
    agent = AgentMetrics(families=("IPv4", "IPv6"))
    agent.attach_backend(Backend_())
    return series(REGISTRY) | series(agent.registry)


def dashboard_exprs() -> list[str]:
    board = json.loads((DEPLOY / "grafana-dashboard.json").read_text())
    exprs = [t["expr"] for p in board["panels"] for t in p["targets"]]
    assert len(exprs) >= len(board["panels"])
    return exprs


def alert_rules() -> list[dict]:
    rules = yaml.safe_load((DEPLOY / "prometheus-alerts.yaml").read_text())
    return [rule for group in rules["groups"] for rule in group["rules"]]


def test_every_metric_the_dashboard_and_alerts_use_is_exported() -> None:
    used = {name for expr in dashboard_exprs() + [r["expr"] for r in alert_rules()]
            for name in NAME.findall(expr)}
    assert {"svcproxy_frontend_cluster_programming_latency_seconds_bucket",
            "svcproxy_frontend_fleet_lagging_nodes", "svcproxy_frontend_fleet_refusing_nodes",
            "svcproxy_frontend_watch_resets_total",
            "kubeproxy_sync_proxy_rules_duration_seconds_bucket"} <= used
    assert sorted(used - exported()) == []


def test_every_alert_says_how_bad_and_what() -> None:
    names = [rule["alert"] for rule in alert_rules()]
    assert len(names) == len(set(names)) >= 8
    for rule in alert_rules():
        assert rule["labels"]["severity"] in ("info", "warning", "critical")
        assert rule["annotations"]["summary"] and rule["for"]
