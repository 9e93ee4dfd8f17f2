"""`adk-gateway policy replay`: the audit trail against a new policy. The core (approvals/replay.py)
by table, the reading of exports (approvals/replay_records.py), then the command on a trail that the
real audit trail wrote (its JSON log lines and its store as the approvals API reads it)."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path
from typing import Any

import pytest
import structlog

from gateway.approvals import audit_trail as audit_module
from gateway.approvals.audit_trail import AuditTrail
from gateway.approvals.notice import Approver, ApprovalNotice
from gateway.approvals.replay import replay, replay_record
from gateway.approvals.replay_records import BadTrail, read_records
from gateway.cli import main
from gateway.cluster.memory import MemoryState
from gateway.config.audit import AuditConfig
from gateway.config.schema import parse_config
from gateway.ops.logs import configure_logging
from gateway.ops.metrics import GatewayMetrics
from tests.unit.test_logs import restore_logging  # noqa: F401 - a fixture

# One agent, `desk`, in the single-agent form; its refund rules follow.
HEAD = """\
internal: {secret: s3cret-internal}
approvers: {groups: {supervisors: {users: [carol]}, leads: {users: [dave]}}}
upstream: {url: "http://adk:8000", app_name: desk}
tools:
  lookup_order: {approval: %(lookup)s}
  issue_refund:
    approval: true
    rules:
"""
RULES = {
    "small": "{name: small, when: args.amount < %s, decide: approve}",
    "large": "{name: large_refund, when: args.amount > 100, decide: ask, approvers: %s, self_approval: false}",
    "huge": "{name: huge, when: args.amount >= %s, decide: deny, reason: Too much.}",
    "vip": "{name: vip, when: user == 'vip', decide: approve}",
}


def config(small: int = 5, group: str = "supervisors", huge: int = 10000, lookup: str = "true", vip: bool = False) -> str:
    rules = [RULES["vip"]] if vip else []
    rules += [RULES["small"] % small, RULES["huge"] % huge, RULES["large"] % group]
    return HEAD % {"lookup": lookup} + "".join(f"      - {rule}\n" for rule in rules)


def record(approval_id: str, amount: Any, source: str, outcome: str, **fields: Any) -> dict[str, Any]:
    data = {"kind": "decided", "approval_id": approval_id, "agent": "desk", "tool": "issue_refund",
            "requester": "bob", "args": {"amount": amount}, "source": source, "outcome": outcome,
            "rule": None, "asked": None}
    data.update(fields)
    return {key: value for key, value in data.items() if value is not ...}


SUPERVISORS = {"approvers": "supervisors", "self_approval": False, "quorum": 1}
CASES = [
    # (why, the record, the new config, verdict, change, loosens)
    ("the same policy changes nothing", record("a", 2, "rule", "approved", rule="small"), config(), "unchanged", None, False),
    ("an approve rule widened: the user's ask becomes automatic", record("a", 20, "person", "approved"),
     config(small=50), "changed", "asked->automatic approve", True),
    ("an approve rule narrowed: automatic becomes asked", record("a", 2, "rule", "approved", rule="small"),
     config(small=1), "changed", "automatic approve->asked", False),
    ("a deny rule lowered: an asked call is now denied", record("a", 250, "approver", "approved", rule="large_refund",
     asked=SUPERVISORS), config(huge=200), "changed", "asked->automatic deny", False),
    ("a deny rule raised: a denial becomes an approvers' ask", record("a", 20000, "rule", "denied", rule="huge"),
     config(huge=50000), "changed", "automatic deny->asked", True),
    ("another group: taken as loosening", record("a", 250, "approver", "approved", rule="large_refund", asked=SUPERVISORS),
     config(group="leads"), "changed", "approvers changed", True),
    ("a user's ask handed to approvers: stricter", record("a", 250, "person", "approved"), config(),
     "changed", "approvers changed", False),
    ("arguments not recorded, a rule reads them: unknown", record("a", ..., "person", "approved", args=...),
     config(), "unknown", None, False),
    ("arguments not recorded, but a rule on the user decides first", record("a", ..., "rule", "approved", args=..., requester="vip"),
     config(vip=True), "unchanged", None, False),
    ("a hashed requester with a rule on the user: unknown", record("a", 2, "rule", "approved", requester=...),
     config(vip=True), "unknown", None, False),
    ("who was asked is not recorded (an older record): unknown", record("a", 250, "approver", "approved", asked=...),
     config(), "unknown", None, False),
    ("who was asked is unreadable: unknown", record("a", 250, "approver", "approved", asked={"approvers": 3}),
     config(), "unknown", None, False),
    ("a timeout of an asked call: asked either way", record("a", 250, "timeout", "timeout", asked=SUPERVISORS),
     config(), "unchanged", None, False),
    ("a browser tool's output is no decision: skipped", record("a", 2, "person", "output"), config(), "skipped", None, False),
    ("a tool whose approval is dropped", record("a", 1, "person", "approved", tool="lookup_order", args=...),
     config(lookup="false"), "changed", "asked->automatic approve", True),
]


@pytest.mark.parametrize(("why", "old", "new", "verdict", "change", "loosens"), CASES, ids=[c[0] for c in CASES])
def test_a_record_against_a_new_policy(why: str, old: dict[str, Any], new: str, verdict: str, change: str | None, loosens: bool) -> None:
    replayed = replay_record(old, parse_config(new, env={}).agents)
    assert (replayed.verdict, replayed.change, replayed.loosens) == (verdict, change, loosens), replayed


def test_unknown_records_fail_closed_and_repeated_ids_count_once() -> None:
    agents = parse_config(config(), env={}).agents
    same = record("a", 2, "rule", "approved", rule="small")
    assert replay([same, same], agents).exit_status == 0 and len(replay([same, same], agents).records) == 1
    unknown = replay([same, record("b", ..., "person", "approved", args=...)], agents)
    assert unknown.exit_status == 1 and unknown.count("unknown") == 1
    gone = replay_record(record("c", 2, "rule", "approved", agent="elsewhere"), agents)
    assert gone.verdict == "unknown" and "not in the new configuration" in (gone.why or "")


def test_reading_exports() -> None:
    one = record("a", 2, "rule", "approved")
    api = json.dumps({"approvals": [{**one, "cursor": "1-0"}], "next": None})
    lines = "\n".join([json.dumps({"event": "gate_opened", "approval_id": "x"}),
                       json.dumps({**one, "event": "approval_audit", "level": "info", "timestamp": "t"}), ""])
    assert read_records(api)[0]["approval_id"] == "a"
    assert read_records(lines) == [one]
    assert read_records(json.dumps([one])) == [one] and read_records(" \n") == []
    for bad, said in (("not json\n", "<audit>:1: not JSON"), ('{"approvals": [1]}', "a JSON object"),
                      (json.dumps({"approval_id": "a"}), "no agent, tool"),
                      (json.dumps({**one, "kind": "waiting"}), "kind 'waiting'")):
        with pytest.raises(BadTrail, match=said):
            read_records(bad)


# ---- the command, on a trail the audit trail wrote ------------------------------------------------


def _notice(approval_id: str, amount: int, source: str, outcome: str, **fields: Any) -> ApprovalNotice:
    return ApprovalNotice(
        "decided", approval_id, "desk", "desk", "issue_refund", f"t-{approval_id}", "chat-1", "bob", {"amount": amount},
        time.time(), source=source, outcome=outcome, **fields,  # type: ignore[arg-type]
    )


@pytest.fixture
async def recorded(tmp_path: Path, restore_logging: None, capsys: pytest.CaptureFixture[str],  # noqa: F811
                   monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """The trail of three decisions as the gateway writes it: its log lines, and its store as the API answers."""
    configure_logging("info", "json")
    monkeypatch.setattr(audit_module, "log", structlog.get_logger("adk_gateway.cluster.audit_trail"))
    audit = AuditTrail(MemoryState("a"), GatewayMetrics(), lambda: AuditConfig(include_args=True), timeout=1.0)
    audit.start()
    for notice in (
        _notice("gw-1", 2, "rule", "approved", rule="small"),
        _notice("gw-2", 20, "person", "approved", approvers=(Approver("bob", "chat"),)),
        _notice("gw-3", 250, "approver", "approved", rule="large_refund", approvers=(Approver("carol", "approver_key"),),
                asked=SUPERVISORS),
    ):
        audit.record(notice)
    await audit.stop(2.0)
    logs, api = tmp_path / "audit.log", tmp_path / "approvals.json"
    logs.write_text(capsys.readouterr().err)
    api.write_text(json.dumps({"approvals": await audit.read(), "next": None}))
    return logs, api


def _run(capsys: pytest.CaptureFixture[str], tmp_path: Path, text: str, trail: Path, *more: str) -> tuple[int, list[str]]:
    status, out, _ = _ran(capsys, tmp_path, text, trail, *more)
    return status, out


def _ran(capsys: pytest.CaptureFixture[str], tmp_path: Path, text: str, trail: Path, *more: str) -> tuple[int, list[str], str]:
    new = tmp_path / "new.yaml"
    new.write_text(text)
    capsys.readouterr()
    status = main(["policy", "replay", "--config", str(new), "--audit", str(trail), *more])
    captured = capsys.readouterr()
    return status, captured.out.splitlines(), captured.err


async def test_the_command_on_a_recorded_trail(
    recorded: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    logs, api = recorded
    for trail in (logs, api):
        status, out = _run(capsys, tmp_path, config(), trail)
        assert status == 0 and out[-1] == "changed 0, loosened 0, unchanged 3, unknown 0, skipped 0: exit 0", out
    # Loosened: small refunds up to 50 run unasked; large ones go to the leads.
    status, out = _run(capsys, tmp_path, config(small=50, group="leads"), logs)
    assert status == 1, out
    assert ("  desk issue_refund: approvers changed: 1 record [LOOSENS]: ask supervisors (four-eyes) by rule large_refund"
            " -> ask leads (four-eyes) by rule large_refund (e.g. gw-3)") in out
    assert ("  desk issue_refund: asked->automatic approve: 1 record [LOOSENS]: ask the chatting user by the tool setting"
            " -> approve by rule small (e.g. gw-2)") in out
    # Tightened: nothing runs unasked, and the large refund is now refused.
    status, out = _run(capsys, tmp_path, config(small=1, huge=200), api, "--json")
    report = json.loads("\n".join(out))
    assert status == 0 and report["exit_status"] == 0 and report["loosened"] == 0 and report["changed"] == 2
    assert {(c["change"], c["example"]) for c in report["changes"]} == {
        ("automatic approve->asked", "gw-1"), ("asked->automatic deny", "gw-3")}


async def test_bad_input_exits_2(recorded: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    logs, _ = recorded
    status, out, err = _ran(capsys, tmp_path, "agents: [", logs)
    assert (status, out) == (2, []) and "new.yaml" in err
    broken = tmp_path / "broken.log"
    lines = len(logs.read_text().splitlines())
    broken.write_text(logs.read_text() + "not a log line\n")
    status, out, err = _ran(capsys, tmp_path, config(), broken)
    assert (status, out) == (2, []) and f"broken.log:{lines + 1}: not JSON" in err
    status, out, err = _ran(capsys, tmp_path, config(), tmp_path / "missing.log")
    assert (status, out) == (2, []) and "missing.log: cannot read" in err


def test_without_a_trail_or_with_an_api_out_of_reach_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    new = tmp_path / "new.yaml"
    new.write_text(config())
    assert main(["policy", "replay", "--config", str(new)]) == 2
    assert "give the trail" in capsys.readouterr().err
    with socket.socket() as closed:  # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    assert main(["policy", "replay", "--config", str(new), "--api", f"http://127.0.0.1:{port}"]) == 2
    assert "the approvals API cannot be reached" in capsys.readouterr().err
