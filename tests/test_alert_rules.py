"""deploy/'s PromQL evaluated by Prometheus's own promtool, and the series it reads at a gateway's start.

- deploy/prometheus/alerts.yml passes `promtool check rules`, and its unit tests
  (deploy/prometheus/alerts.test.yml) pass `promtool test rules`; every alert there has a case
  where it fires.
- The dashboard's "Replicas ready" query, run by promtool over replicas in each state /readyz
  reports, counts only the ready ones.
- A served gateway exports, before any event, the series the alerts' `increase()` rises from.

promtool comes from Debian's `prometheus` package: `make test` installs it. Without it these tests
fail (a skip would let a run that never checked the rules pass).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.procs import DEMO_TOOLS, free_port, gateway_process

ROOT = Path(__file__).resolve().parents[1]
PROMETHEUS = ROOT / "deploy" / "prometheus"
ALERTS = PROMETHEUS / "alerts.yml"
ALERT_TESTS = PROMETHEUS / "alerts.test.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "dashboards" / "adk-gateway.json"


@pytest.fixture(scope="module")
def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.fail("promtool is not installed: `make promtool` installs it (Debian's prometheus package)")
    return found


def _promtool(promtool: str, *args: str, cwd: Path) -> None:
    run = subprocess.run([promtool, *args], cwd=cwd, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, f"promtool {' '.join(args)}:\n{run.stdout}{run.stderr}"


def _alert_names() -> list[str]:
    groups = yaml.safe_load(ALERTS.read_text(encoding="utf-8"))["groups"]
    return [rule["alert"] for group in groups for rule in group["rules"] if "alert" in rule]


def test_promtool_checks_the_alert_rules(promtool: str) -> None:
    _promtool(promtool, "check", "rules", ALERTS.name, cwd=PROMETHEUS)


def test_alert_rule_unit_tests_pass(promtool: str) -> None:
    _promtool(promtool, "test", "rules", ALERT_TESTS.name, cwd=PROMETHEUS)


def test_every_alert_has_a_case_where_it_fires() -> None:
    tests = yaml.safe_load(ALERT_TESTS.read_text(encoding="utf-8"))
    assert tests["rule_files"] == [ALERTS.name]
    checks = [check for case in tests["tests"] for check in case.get("alert_rule_test") or []]
    names = _alert_names()
    fired = {check["alertname"] for check in checks if check.get("exp_alerts")}
    assert not set(names) - fired, f"alerts.test.yml never shows these alerts firing: {sorted(set(names) - fired)}"
    unknown = {check["alertname"] for check in checks} - set(names)
    assert not unknown, f"alerts.test.yml tests alerts that alerts.yml does not define: {sorted(unknown)}"


# ---- the dashboard's readiness count ---------------------------------------------------------------


def _panel_expr(title: str) -> str:
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    panels = [p for p in dashboard["panels"] if p.get("title") == title]
    assert len(panels) == 1, f"the dashboard has {len(panels)} panels titled {title!r}"
    (target,) = panels[0]["targets"]
    # The instance variable set to All.
    return str(target["expr"]).replace("$instance", ".*")


# One replica in each state /readyz (gateway/edge/app.py) tells apart: only r1 answers 200, which its
# adk_gateway_ready says (gateway.app.readiness; tests/unit/test_agents.py holds the two together).
REPLICA_STATES = {
    "r1:8080": {"upstream_up": 1, "sessions_backend_up": 1, "draining": 0, "ready": 1},
    "r2:8080": {"upstream_up": 0, "sessions_backend_up": 1, "draining": 0, "ready": 0},
    "r3:8080": {"upstream_up": 1, "sessions_backend_up": 0, "draining": 0, "ready": 0},
    "r4:8080": {"upstream_up": 1, "sessions_backend_up": 1, "draining": 1, "ready": 0},
}


def _series(states: dict[str, dict[str, int]]) -> list[dict[str, str]]:
    return [
        {"series": f'adk_gateway_{gauge}{{job="adk-gateway", instance="{instance}"}}', "values": f"{value}x4"}
        for instance, gauges in states.items() for gauge, value in gauges.items()
    ]


def test_replicas_ready_counts_replicas_that_readyz_calls_ready(promtool: str, tmp_path: Path) -> None:
    expr = _panel_expr("Replicas ready")
    none_ready = {i: {**s, "draining": 1, "ready": 0} for i, s in REPLICA_STATES.items()}
    cases: list[dict[str, Any]] = [
        {"interval": "15s", "input_series": _series(REPLICA_STATES),
         "promql_expr_test": [{"expr": expr, "eval_time": "30s", "exp_samples": [{"labels": "{}", "value": 1}]}]},
        # 0, not "No data", when no replica is ready: the stat turns red.
        {"interval": "15s", "input_series": _series(none_ready),
         "promql_expr_test": [{"expr": expr, "eval_time": "30s", "exp_samples": [{"labels": "{}", "value": 0}]}]},
    ]
    (tmp_path / "empty.yml").write_text("groups: []\n")
    (tmp_path / "ready.test.yml").write_text(yaml.safe_dump({"rule_files": ["empty.yml"], "tests": cases}))
    _promtool(promtool, "test", "rules", "ready.test.yml", cwd=tmp_path)


# ---- what a gateway exports at start ----------------------------------------------------------------

# What the alerts' increase() and rate() read, at a gateway's start (DEMO_TOOLS gates process_payment
# with approval, get_location in the browser).
ALERT_SERIES_AT_START = [
    ("adk_gateway_config_reloads_total", {"result": "failure"}),
    ("adk_gateway_owner_lost_total", {"what": "run"}),
    ("adk_gateway_owner_lost_total", {"what": "gated_call"}),
    # Per agent: the config's single agent is named after its app (demo_agent).
    ("adk_gateway_policy_bypassed_total", {"agent": "demo_agent", "tool": "process_payment"}),
    ("adk_gateway_policy_bypassed_total", {"agent": "demo_agent", "tool": "get_location"}),
    ("adk_gateway_approval_timeouts_total", {"agent": "demo_agent", "tool": "process_payment"}),
    ("adk_gateway_approval_wait_seconds_count", {"agent": "demo_agent", "tool": "process_payment", "outcome": "timeout"}),
    ("adk_gateway_upstream_errors_total", {"agent": "demo_agent", "kind": "connect"}),
    ("adk_gateway_runs_total", {"agent": "demo_agent", "outcome": "completed"}),
    ("adk_gateway_upstream_up", {"agent": "demo_agent"}),
    ("adk_gateway_ready", {}),
    ("adk_gateway_shared_limit_checks_total", {"check": "rate", "result": "local"}),
    ("adk_gateway_shared_limit_checks_total", {"check": "stream", "result": "refused"}),
    # Per configured webhook (the config below has one).
    ("adk_gateway_webhook_deliveries_total", {"webhook": "approvals", "event": "waiting", "result": "failed"}),
    ("adk_gateway_webhook_deliveries_total", {"webhook": "approvals", "event": "decided", "result": "dropped"}),
]


def test_a_served_gateway_exports_what_the_alerts_read_at_zero(tmp_path: Path) -> None:
    config = DEMO_TOOLS.format(payment_timeout="5m", on_timeout="deny") + (
        f"internal:\n  port: {free_port()}\n  secret: alert-rules-test\n"
        "notifications:\n  webhooks:\n    - {name: approvals, url: 'http://127.0.0.1:9/hook', secret: alert-rules-webhook-secret}\n"
    )
    with gateway_process(tmp_path, f"http://127.0.0.1:{free_port()}", config) as gw:
        with urllib.request.urlopen(f"{gw.base}/metrics", timeout=10) as resp:
            text = resp.read().decode()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text) for s in family.samples
    }
    for name, labels in ALERT_SERIES_AT_START:
        value = samples.get((name, tuple(sorted(labels.items()))))
        assert value == 0, f"{name}{labels} is {'absent' if value is None else value} at start, not 0"
