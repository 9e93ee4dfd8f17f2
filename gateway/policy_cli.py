"""`adk-gateway policy replay`: the audit trail replayed against a new configuration, from the command line.

The files are read here and the report printed here; what a record comes to is approvals/replay.py's
to say, and reading an export approvals/replay_records.py's. The trail comes from exported files
(`--audit`, repeated; `-` is standard input): the approvals API's `GET /api/approvals?state=decided`
answers, or the `approval_audit` log lines; or from a running gateway's store through that same API
(`--api URL`, every page, as an auditor whose key is in the environment, never on the command line).
The store itself (Redis or memory) is not opened here: with Redis its records are sealed under
`internal.secret` for the replicas, and the memory store lives in the gateway's process; the API
reads either for the auditors (docs/approvals.md).

Exit status: 0 nothing loosens (tightenings are listed), 1 something loosens or a record could not
be replayed, 2 bad input (the configuration or a trail file).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from .approvals.replay import Replay, replay
from .approvals.replay_records import BadTrail, read_records
from .config.schema import load_config

__all__ = ["add_policy_commands"]

EXIT_BAD_INPUT = 2
# Where `--api` finds the auditor's key by default.
KEY_ENV = "ADK_GATEWAY_AUDITOR_KEY"
# A page of the approvals API is at most 1000 records and the store keeps `audit.keep` (100,000 by
# default): 1000 pages bound a read of any store as configured, and a gateway that keeps answering.
_MAX_PAGES = 1000
_TIMEOUT = 30.0


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
        "--audit", action="append", default=[], metavar="FILE",
        help="an exported trail: GET /api/approvals?state=decided JSON, or approval_audit log lines (- : stdin); repeatable",
    )
    command.add_argument("--api", metavar="URL", help="read the trail from a running gateway's approvals API, as an auditor")
    command.add_argument("--key-env", metavar="VAR", default=KEY_ENV,
                         help=f"with --api: the environment variable holding the auditor's key (default {KEY_ENV})")
    command.add_argument("--json", action="store_true", help="print the report as JSON")
    command.set_defaults(func=_cmd_replay)


def _cmd_replay(args: argparse.Namespace) -> int:
    config = load_config(args.config)  # ConfigError: the caller prints it and exits 2
    if not args.audit and not args.api:
        print("policy replay: give the trail, --audit FILE or --api URL", file=sys.stderr)
        return EXIT_BAD_INPUT
    records = []
    try:
        for name in args.audit:
            text = sys.stdin.read() if name == "-" else Path(name).read_text(encoding="utf-8")
            records += read_records(text, "<stdin>" if name == "-" else name)
        if args.api:
            records += _from_api(args.api, os.environ.get(args.key_env, ""))
    except (OSError, UnicodeDecodeError, BadTrail) as exc:
        print(_problem(exc), file=sys.stderr)
        return EXIT_BAD_INPUT
    report = replay(records, config.agents)
    if args.json:
        print(json.dumps({"config": str(args.config), **report.as_json()}, indent=2))
    else:
        print("\n".join(report_lines(report, str(args.config))))
    return report.exit_status


def _problem(exc: Exception) -> str:
    if isinstance(exc, urllib.error.HTTPError):
        return f"{exc.url}: answered {exc.code} {exc.read(500).decode(errors='replace')}"
    if isinstance(exc, urllib.error.URLError):
        return f"the approvals API cannot be reached: {exc.reason}"
    if isinstance(exc, OSError) and exc.filename:
        return f"{exc.filename}: cannot read: {exc.strerror or exc}"
    return str(exc)


def _from_api(base: str, key: str) -> list[dict[str, Any]]:
    """Every decided record the approvals API lists, oldest first, page after page."""
    records: list[dict[str, Any]] = []
    after: str | None = None
    for _ in range(_MAX_PAGES):
        query = urllib.parse.urlencode({"state": "decided", "limit": 1000, **({"after": after} if after else {})})
        url = f"{base.rstrip('/')}/api/approvals?{query}"
        request = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"} if key else {})
        with urllib.request.urlopen(request, timeout=_TIMEOUT) as answer:  # noqa: S310 - the operator's URL
            text = answer.read().decode("utf-8")
        records += read_records(text, url)
        page = json.loads(text)
        after = page.get("next") if isinstance(page, dict) else None
        if not after:
            return records
    raise BadTrail(f"{base}: more than {_MAX_PAGES} pages of records")


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
