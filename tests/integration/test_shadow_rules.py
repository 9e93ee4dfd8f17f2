"""Reviewing a policy change end to end: a shadow rule on the demo's payments, in confirm mode over SSE
(the stock ADK API server with the plugin, a stock ai 7 Chat), decides nothing but is logged, counted
and kept in the audit records, ADK's confirmation's included; then `adk-gateway policy replay` reads the
recorded `approval_audit` lines, and the running gateway's store through the approvals API, against
the same policy with the rule enforced."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gateway.cli import main
from tests.integration.conftest import SharedAgents, plugin_agent
from tests.jsdriver import assert_clean, run_chats
from tests.procs import DEMO_TOOLS, metric_value, plugin_stack

pytestmark = [pytest.mark.integration, pytest.mark.js]

AUDITOR_KEY = "auditor-key-for-tests"
SHADOW = """      - name: try_cap
        when: args.amount > 20
        decide: deny
        reason: Payments over 20 would be refused.
        shadow: true
"""


def _with_shadow_rule() -> str:
    denied = "        reason: Payments of 10,000 or more are refused.\n"
    assert denied in DEMO_TOOLS
    return DEMO_TOOLS.replace(denied, denied + SHADOW, 1)


def test_a_shadow_rule_decides_nothing_and_its_findings_reach_the_log_the_metric_the_trail_and_a_replay(
    tmp_path: Path, shared_agents: SharedAgents, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    extra = ("audit:\n  include_args: true\n"
             f"approvers:\n  api_keys:\n    - id: auditor\n      key: {AUDITOR_KEY}\n  auditors:\n    users: [auditor]\n")
    with plugin_stack(tmp_path, tools=_with_shadow_rule(), extra=extra, agent=plugin_agent(shared_agents)) as stack:
        runs = [{"version": 7, "api": f"{stack.gateway.base}/api/chat", "steps": [{"send": text, "approvals": "approve"}]}
                for text in ("pay 50 to Hanako", "pay 2 to Hanako")]
        results = run_chats(runs, timeout=60)
        for result in results:
            assert_clean(result)
        base = stack.gateway.base
        counted = {agreement: metric_value(base, "adk_gateway_policy_shadow_total", {"rule": "try_cap", "agreement": agreement})
                   for agreement in ("agree", "stricter", "looser")}
        lines = stack.gateway.log_lines()
        config = stack.config_path.read_text()
        enforced = tmp_path / "enforced.yaml"
        enforced.write_text(config.replace("        shadow: true\n", ""))
        # The running gateway's store, through the approvals API, as an auditor (the key from the environment).
        monkeypatch.setenv("ADK_GATEWAY_AUDITOR_KEY", AUDITOR_KEY)
        capsys.readouterr()
        from_store = main(["policy", "replay", "--config", str(enforced), "--api", base, "--json"])
        stored = json.loads(capsys.readouterr().out)
        monkeypatch.setenv("ADK_GATEWAY_AUDITOR_KEY", "not-the-key")
        refused = main(["policy", "replay", "--config", str(enforced), "--api", base])
        assert refused == 2 and "answered 401" in capsys.readouterr().err
    # Enforced, the rule would have refused 50; as a shadow it let the person be asked, and 50 was paid.
    parts = [p for r in results for m in r["messages"] for p in m["parts"] if p["type"] == "tool-process_payment"]
    assert sorted(p["input"]["amount"] for p in parts if p["state"] == "output-available") == [2, 50]
    assert counted == {"agree": 1, "stricter": 1, "looser": 0}
    shadow = sorted((line["would_decide"]["decide"], line["decided"], line["agreement"])
                    for line in lines if line.get("event") == "policy_shadow")
    assert shadow == [("approve", "approve", "agree"), ("deny", "ask", "stricter")]
    audit = [line for line in lines if line.get("event") == "approval_audit"]
    by_amount = {line["args"]["amount"]: line for line in audit}
    # 50: ADK's confirmation, answered by the person; its findings came back from ADK's session.
    assert (by_amount[50]["source"], by_amount[50]["outcome"]) == ("person", "approved")
    assert [(f["rule"], f["would_decide"]["decide"], f["agreement"]) for f in by_amount[50]["shadow"]] == [
        ("try_cap", "deny", "stricter")]
    assert (by_amount[2]["source"], [f["agreement"] for f in by_amount[2]["shadow"]]) == ("rule", ["agree"])

    # The recorded lines, replayed against the same policy with the rule enforced: a tightening only.
    trail = tmp_path / "approval_audit.log"
    trail.write_text("".join(json.dumps(line) + "\n" for line in audit))
    capsys.readouterr()
    status = main(["policy", "replay", "--config", str(enforced), "--audit", str(trail), "--json"])
    report = json.loads(capsys.readouterr().out)
    for code, replayed in ((status, report), (from_store, stored)):
        assert code == 0 and replayed["records"] == 2 and replayed["loosened"] == 0 and replayed["unknown"] == 0, replayed
        assert [(c["tool"], c["change"], c["now"]["rule"], c["records"]) for c in replayed["changes"]] == [
            ("process_payment", "asked->automatic deny", "try_cap", 1)]
