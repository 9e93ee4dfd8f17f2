"""A venv per ADK version for the demo agent, with the plugin installed as an operator would.

``python -m gateway.demo.adk_venv 1.22.1`` makes ``.venv-adk-1.22.1`` at the checkout's root (git
ignores it) and prints its path. It is the agent side of ``make run-adk ADK=1.22.1`` and of the
tests that run the demo on an older ADK (tests/integration/test_adk_versions.py):

1. a fresh venv, then ``pip install google-adk==<version>``: the agent environment an operator
   already has;
2. ``pip install ./plugin`` from the checkout, exactly as docs/approvals.md tells the operator;
3. the installed distributions before and after step 2 are compared: the plugin must add itself
   and nothing else, and change no installed version (google-adk and google-genai above all).
   Anything else is refused, and the venv is not marked ready.

The result is recorded in ``.venv-adk-<version>/adk-gateway-venv.json``; a later call returns at
once while the plugin's sources are unchanged, and reinstalls only the plugin (checked the same
way) when they changed. A venv whose build was interrupted has no record and is rebuilt. Two
callers building the same version at once wait for each other (a lock file beside the venv).

Standard library only: the builder runs in the project's venv, the venv it builds has no gateway.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["PLUGIN_DIR", "ROOT", "VenvError", "ensure", "venv_dir"]

ROOT = Path(__file__).resolve().parents[2]
PLUGIN_DIR = ROOT / "plugin"
RECORD = "adk-gateway-venv.json"
PLUGIN_DISTRIBUTION = "adk-gateway-plugin"
# The versions an operator cares about most; all of them must survive the plugin install unchanged.
WATCHED = ("google-adk", "google-genai")

_VERSION_RE = re.compile(r"^\d+\.\d+(\.\d+)?([a-z]+\d+)?$")


class VenvError(RuntimeError):
    """The venv could not be built, or installing the plugin changed the agent's environment."""


def venv_dir(version: str) -> Path:
    return ROOT / f".venv-adk-{version}"


def ensure(version: str, *, python: str | None = None, log=None) -> Path:
    """The ready venv for google-adk==`version`: built, or rebuilt, as needed."""
    if not _VERSION_RE.match(version):
        raise VenvError(f"not a google-adk release number: {version!r} (e.g. 1.22.1)")
    say = log or (lambda message: print(f"adk_venv: {message}", file=sys.stderr, flush=True))
    target = venv_dir(version)
    with _locked(target.with_name(target.name + ".lock")):
        record = _read_record(target)
        if record is not None and not isinstance(record.get("before_plugin"), dict):
            record = None  # from an older builder: start again
        digest = plugin_digest()
        if record is not None and record.get("plugin_digest") == digest and (target / "bin" / "adk").exists():
            return target
        started = time.monotonic()
        if record is None:
            if target.exists():
                say(f"{target.name} has no record of a finished build: rebuilding it")
                shutil.rmtree(target)
            say(f"creating {target.name} (python -m venv, then pip install google-adk=={version}; a few minutes)")
            subprocess.run([python or sys.executable, "-m", "venv", str(target)], check=True)
            _pip(target, "install", "--quiet", f"google-adk=={version}")
            adk_installed_in = round(time.monotonic() - started, 1)
        else:
            say(f"the plugin's sources changed: reinstalling it in {target.name}")
            adk_installed_in = record.get("adk_install_seconds")
            before_plugin = record.get("before_plugin")
        before = installed(target)
        if record is None:
            before_plugin = before
        if before.get("google-adk") != version:
            raise VenvError(f"{target.name}: pip installed google-adk {before.get('google-adk')}, not {version}")
        # Exactly the operator's command of docs/approvals.md (run from the checkout's root).
        plugin_started = time.monotonic()
        _pip(target, "install", "--quiet", "./plugin")
        after = installed(target)
        problems = changes(before, after, fresh=record is None)
        if problems:
            raise VenvError(
                f"installing the plugin changed {target.name}'s environment: " + "; ".join(problems)
            )
        record = {
            "google-adk": version,
            "watched": {name: after.get(name) for name in WATCHED},
            # What the venv held before the plugin was first installed: the operator's environment.
            "before_plugin": before_plugin,
            "plugin_digest": digest,
            "adk_install_seconds": adk_installed_in,
            "plugin_install_seconds": round(time.monotonic() - plugin_started, 1),
            "installed": after,
        }
        (target / RECORD).write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
        say(
            f"{target.name} ready in {time.monotonic() - started:.0f} s: google-adk {after['google-adk']}, "
            f"google-genai {after.get('google-genai')}, {PLUGIN_DISTRIBUTION} {after[PLUGIN_DISTRIBUTION]}"
        )
        return target


def changes(before: dict[str, str], after: dict[str, str], *, fresh: bool = True) -> list[str]:
    """What the plugin install did besides adding (or, on a reinstall, keeping) the plugin."""
    problems = []
    for name, version in sorted(before.items()):
        if name == PLUGIN_DISTRIBUTION:
            continue
        if name not in after:
            problems.append(f"removed {name} {version}")
        elif after[name] != version:
            problems.append(f"{name} {version} -> {after[name]}")
    added = sorted(set(after) - set(before) - {PLUGIN_DISTRIBUTION})
    problems += [f"added {name} {after[name]}" for name in added]
    if PLUGIN_DISTRIBUTION not in after:
        problems.append(f"{PLUGIN_DISTRIBUTION} is not installed")
    elif fresh and PLUGIN_DISTRIBUTION in before:
        problems.append(f"{PLUGIN_DISTRIBUTION} was there before the install")
    return problems


def installed(target: Path) -> dict[str, str]:
    """Every distribution in the venv: normalised name -> version."""
    out = _pip(target, "list", "--format=json", capture=True)
    return {_normalise(d["name"]): d["version"] for d in json.loads(out)}


def read_record(version: str) -> dict | None:
    return _read_record(venv_dir(version))


def plugin_digest() -> str:
    """A digest of the plugin's sources: the venv's copy is stale when it changes."""
    digest = hashlib.sha256()
    files = [PLUGIN_DIR / "pyproject.toml", *sorted((PLUGIN_DIR / "adk_gateway_plugin").rglob("*"))]
    for path in files:
        if path.is_file() and "__pycache__" not in path.parts:
            digest.update(str(path.relative_to(PLUGIN_DIR)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _read_record(target: Path) -> dict | None:
    try:
        return json.loads((target / RECORD).read_text())
    except (OSError, ValueError):
        return None


def _pip(target: Path, *args: str, capture: bool = False) -> str:
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    # Not the project venv's: pip must act on the target venv only.
    env.pop("VIRTUAL_ENV", None)
    result = subprocess.run(
        [str(target / "bin" / "python"), "-m", "pip", *args], check=False, cwd=ROOT, env=env, text=True,
        stdout=subprocess.PIPE if capture else None, stderr=subprocess.PIPE,
    )
    if result.returncode != 0:
        raise VenvError(f"pip {' '.join(args)} failed in {target.name}:\n{result.stderr[-3000:]}")
    return result.stdout or ""


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    with path.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gateway.demo.adk_venv", description=__doc__.splitlines()[0])
    parser.add_argument("version", help="the google-adk release, e.g. 1.22.1")
    parser.add_argument("--python", help="the interpreter to base the venv on (default: this one)")
    args = parser.parse_args(argv)
    try:
        print(ensure(args.version, python=args.python))
    except (VenvError, subprocess.CalledProcessError) as exc:
        print(f"adk_venv: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
