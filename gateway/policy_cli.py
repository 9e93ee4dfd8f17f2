"""`adk-gateway policy replay`: the audit trail replayed against a new configuration, from the command line.

The files are read here and the report printed here; what a record comes to is approvals/replay.py's
to say, and reading an export approvals/replay_records.py's. The trail comes from exported files
(`--audit`, repeated; `-` is standard input): the approvals API's `GET /api/approvals?state=decided`
answers, or the `approval_audit` log lines. Reading the running gateway's store directly is not
done: with Redis its records are sealed under `internal.secret` for the replicas, and the memory
store lives in the gateway's process; the API is the auditors' way in (docs/approvals.md).

Exit status: 0 nothing loosens (tightenings are listed), 1 something loosens or a record could not
be replayed, 2 bad input (the configuration or a trail file).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from .approvals.replay import Replay, replay
from .approvals.replay_records import BadTrail, read_records
from .config.schema import load_config

__all__ = ["add_policy_commands"]

EXIT_BAD_INPUT = 2


def add_policy_commands(sub: Any) -> None:
    """`policy replay` under the `adk-gateway` parser's subcommands `sub`."""
    policy = sub.add_parser("policy", help="review a policy change")
    commands = policy.add_subparsers(dest="policy_command", required=True)
    command = commands.add_parser(
        "replay", help="replay the audit trail against a new config: what would be decided differently",
        description=__doc__.splitlines()[0] if __doc__ else None,
    )
    command.add_argument("--config", type=Path, required=True, help="the new configuration (YAML)")
    command.add_argument(
        "--audit", action="append", required=True, metavar="FILE",
        help="an exported trail: GET /api/approvals?state=decided JSON, or approval_audit log lines (- : stdin); repeatable",
    )
    command.add_argument("--json", action="store_true", help="print the report as JSON")
    command.set_defaults(func=_cmd_replay)


def _cmd_replay(args: argparse.Namespace) -> int:
    config = load_config(args.config)  # ConfigError: the caller prints it and exits 2
    records = []
    try:
        for name in args.audit:
            text = sys.stdin.read() if name == "-" else Path(name).read_text(encoding="utf-8")
            records += read_records(text, "<stdin>" if name == "-" else name)
    except (OSError, UnicodeDecodeError) as exc:
        print(f"{name}: cannot read: {getattr(exc, 'strerror', None) or exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except BadTrail as exc:
        print(str(exc), file=sys.stderr)
        return EXIT_BAD_INPUT
    report = replay(records, config.agents)
    if args.json:
        print(json.dumps({"config": str(args.config), **report.as_json()}, indent=2))
    else:
        print("\n".join(report_lines(report, str(args.config))))
    return report.exit_status


def _who(decision: dict[str, Any] | None) -> str:
    if decision is None:
        return "?"
    text = decision["decide"]
    if text == "ask":
        text = f"ask {decision['approvers']}" if "approvers" in decision else "ask the chatting user"
        terms = [f"quorum {decision.get('quorum')}"] if decision.get("quorum", 1) > 1 else []
        terms += ["four-eyes"] if decision.get("self_approval") is False else []
        text += f" ({', '.join(terms)})" if terms else ""
    return f"{text} by {'rule ' + decision['rule'] if decision['rule'] else 'the tool setting'}"


def _records(count: int) -> str:
    return f"{count} record" if count == 1 else f"{count} records"


def report_lines(report: Replay, config: str) -> list[str]:
    """The report as a person reads it: changes per agent and tool, then what could not be replayed."""
    lines = [f"policy replay: {len(report.records)} records against {config}"]
    for change in report.changes():
        mark = "LOOSENS" if change["loosens"] else "tightens"
        lines.append(
            f"  {change['agent']} {change['tool']}: {change['change']}: {_records(change['records'])} [{mark}]: "
            f"{_who(change['was'])} -> {_who(change['now'])} (e.g. {change['example']})"
        )
    for verdict, title in (("unknown", "cannot be replayed"), ("skipped", "skipped")):
        for group in report.left_out(verdict):  # type: ignore[arg-type]
            lines.append(f"  {group['agent']} {group['tool']}: {title}: {_records(group['records'])}: {group['why']}")
    lines.append(
        f"changed {report.count('changed')}, loosened {report.loosened}, unchanged {report.count('unchanged')}, "
        f"unknown {report.count('unknown')}, skipped {report.count('skipped')}: exit {report.exit_status}"
    )
    return lines
