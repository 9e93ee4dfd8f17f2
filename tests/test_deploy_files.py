"""Consistency checks of the container files (deploy/Dockerfile, deploy/compose.yaml, .dockerignore).

There is no Docker engine where the tests run, so instead of building the image these tests read
the files and hold them against the project they package: the paths they copy, the command they
run, the config keys and environment variables they rely on, the ports and routes they probe.
Everything is local and fast; the only sockets are on loopback (a stub HTTP server that the image's
HEALTHCHECK command is run against).
"""

from __future__ import annotations

import argparse
import http.server
import importlib
import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
import threading
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from gateway.config.schema import ConfigError, load_config

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = ROOT / "deploy" / "Dockerfile"
COMPOSE = ROOT / "deploy" / "compose.yaml"
DOCKERIGNORE = ROOT / ".dockerignore"
CONFIG = ROOT / "config" / "gateway.yaml"
PYPROJECT = ROOT / "pyproject.toml"

# The same ${NAME} / ${NAME:-default} syntax gateway.config substitutes.
CONFIG_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(:-[^}]*)?\}")
# Image variables for the Python runtime itself, not for the gateway's config.
RUNTIME_ENV = re.compile(r"^(PATH|VIRTUAL_ENV|LANG|LC_[A-Z]+|PYTHON[A-Z_]*|PIP_[A-Z_]*)$")
LOOPBACK = {"127.0.0.1", "localhost", "::1"}


# --------------------------------------------------------------------------------------------------
# Dockerfile reading


@dataclass
class Instruction:
    keyword: str
    args: str
    line: int

    def exec_form(self) -> list[str] | None:
        """The JSON (exec) form's argv, or None for the shell form."""
        text = self.args.strip()
        if text.startswith("["):
            try:
                value = json.loads(text)
            except ValueError:
                return None
            if isinstance(value, list) and all(isinstance(v, str) for v in value):
                return value
        return None

    def words(self) -> list[str]:
        return self.exec_form() or shlex.split(self.args)

    def flags_and_rest(self) -> tuple[dict[str, str], list[str]]:
        """`--from=x --chown=y a b c` -> ({'from': 'x', 'chown': 'y'}, ['a', 'b', 'c'])."""
        text = self.args.strip()
        flags: dict[str, str] = {}
        while text.startswith("--"):
            flag, _, text = text.partition(" ")
            name, _, value = flag[2:].partition("=")
            flags[name] = value
            text = text.strip()
        rest = Instruction(self.keyword, text, self.line)
        return flags, rest.words()


@dataclass
class Stage:
    base: str
    name: str | None
    index: int
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]

    def last(self, keyword: str) -> Instruction | None:
        found = self.all(keyword)
        return found[-1] if found else None

    def env(self) -> dict[str, str]:
        env: dict[str, str] = {}
        for ins in self.all("ENV"):
            words = shlex.split(ins.args)
            if words and "=" not in words[0]:  # legacy `ENV NAME value with spaces`
                env[words[0]] = " ".join(words[1:])
                continue
            for word in words:
                name, _, value = word.partition("=")
                env[name] = value
        return env


def read_dockerfile(path: Path = DOCKERFILE) -> list[Stage]:
    logical: list[tuple[int, str]] = []
    pending, start = "", 0
    for number, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        stripped = raw.strip()
        if stripped.startswith("#") or (not stripped and not pending):
            continue  # comments (also inside continuations) and blank lines
        if not pending:
            start = number
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        logical.append((start, pending + stripped))
        pending = ""
    assert not pending, f"{path}: the last instruction ends with a line continuation"

    stages: list[Stage] = []
    for number, text in logical:
        keyword, _, args = text.partition(" ")
        keyword = keyword.upper()
        if keyword == "FROM":
            words = args.split()
            words = [w for w in words if not w.startswith("--")]
            name = words[2] if len(words) >= 3 and words[1].lower() == "as" else None
            stages.append(Stage(base=words[0], name=name, index=len(stages)))
            continue
        if keyword == "ARG" and not stages:
            continue
        assert stages, f"{path}:{number}: {keyword} before the first FROM"
        stages[-1].instructions.append(Instruction(keyword, args.strip(), number))
    assert stages, f"{path}: no FROM instruction"
    return stages


def stage_named(stages: list[Stage], ref: str) -> Stage | None:
    for stage in stages:
        if stage.name == ref or str(stage.index) == ref:
            return stage
    return None


@dataclass
class Copy:
    stage: Stage
    ins: Instruction
    sources: list[str]
    dest: str
    from_stage: str | None


def copies(stages: list[Stage]) -> list[Copy]:
    out = []
    for stage in stages:
        for ins in stage.instructions:
            if ins.keyword not in ("COPY", "ADD"):
                continue
            flags, words = ins.flags_and_rest()
            assert len(words) >= 2, f"Dockerfile:{ins.line}: {ins.keyword} needs a source and a destination"
            out.append(Copy(stage, ins, words[:-1], words[-1], flags.get("from")))
    return out


def copy_destination(copy: Copy, source: str) -> str:
    """Where `source` lands in the image (relative destinations resolve against WORKDIR)."""
    dest = copy.dest
    if not dest.startswith("/"):
        workdir = "/"
        for ins in copy.stage.instructions:
            if ins is copy.ins:
                break
            if ins.keyword == "WORKDIR":
                workdir = str(Path(workdir) / ins.args.strip())
        dest = str(Path(workdir) / dest)
    if copy.dest.endswith("/") or len(copy.sources) > 1:
        return str(Path(dest) / Path(source).name)
    return dest


# --------------------------------------------------------------------------------------------------
# .dockerignore, with Docker's rules: patterns anchored at the context root, `**` for any depth,
# `!` re-includes, the last matching line wins, and a pattern matching a folder excludes its content.


def _pattern_regex(pattern: str) -> re.Pattern[str]:
    out, i = "", 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pattern[i] == "?":
            out, i = out + "[^/]", i + 1
        elif pattern[i] == "[":
            end = pattern.find("]", i)
            out, i = (out + pattern[i : end + 1], end + 1) if end > i else (out + r"\[", i + 1)
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return re.compile(out + r"\Z")


def dockerignore_rules(path: Path = DOCKERIGNORE) -> list[tuple[bool, re.Pattern[str], str]]:
    rules = []
    if not path.exists():
        return rules
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        pattern = os.path.normpath(line.lstrip("!").strip()).lstrip("/")
        rules.append((negate, _pattern_regex(pattern), line))
    return rules


def excluded_by(rel: str, rules: list[tuple[bool, re.Pattern[str], str]]) -> str | None:
    """The .dockerignore line that keeps `rel` out of the build context, or None."""
    parts = Path(rel).parts
    prefixes = ["/".join(parts[: n + 1]) for n in range(len(parts))]
    verdict: str | None = None
    for negate, regex, line in rules:
        if any(regex.match(p) for p in prefixes):
            verdict = None if negate else line
    return verdict


# --------------------------------------------------------------------------------------------------
# config/gateway.yaml and compose.yaml reading


def config_references(path: Path = CONFIG) -> dict[str, str | None]:
    """NAME -> default (None when there is none) for every ${NAME...} in the config's values.

    Parsed, not grepped, so ${...} written in comments does not count."""
    refs: dict[str, str | None] = {}

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)
        elif isinstance(node, str):
            for match in CONFIG_VAR.finditer(node):
                default = match.group(2)[2:] if match.group(2) is not None else None
                if match.group(1) not in refs or refs[match.group(1)] is not None:
                    refs[match.group(1)] = default

    walk(yaml.safe_load(path.read_text(encoding="utf-8")))
    return refs


COMPOSE_VAR = re.compile(r"\$(?:\$|\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?])([^}]*))?\}|([A-Za-z_][A-Za-z0-9_]*))")


def interpolate(value: str, shell: dict[str, str]) -> str:
    """Compose's ${VAR}, ${VAR:-default}, ${VAR:?error} and $$, from the calling shell's `shell` env.

    A variable compose requires (`:?`) but the shell lacks becomes `<from the shell: NAME>`, which is
    the same string wherever it is used, as the real value would be."""

    def replace(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name = match.group(1) or match.group(4)
        op, arg = match.group(2), match.group(3)
        value = shell.get(name)
        if op and op.endswith("-"):
            return arg if value is None or (op == ":-" and value == "") else value
        if op and op.endswith("?"):
            return value if value else f"<from the shell: {name}>"
        return value or ""

    return COMPOSE_VAR.sub(replace, value)


def service_env(service: dict[str, Any], shell: dict[str, str] | None = None) -> dict[str, str | None]:
    """A compose service's `environment` (mapping or list form), interpolated as compose would.

    None means passed through from the calling shell when set there."""
    shell = {} if shell is None else shell
    env = service.get("environment") or {}
    out: dict[str, str | None] = {}
    if isinstance(env, list):
        for item in env:
            name, sep, value = str(item).partition("=")
            out[name] = interpolate(value, shell) if sep else None
        return out
    for key, value in env.items():
        out[str(key)] = None if value is None else interpolate(str(value), shell)
    return out


def gateway_service_names(compose: dict[str, Any]) -> list[str]:
    """The gateway replicas: services that run the project image's own CMD (`adk-gateway serve`),
    that is services built from deploy/Dockerfile (or using the image such a service builds) with
    no `command` or `entrypoint` of their own. The agent runs the same image with a command."""
    services = compose.get("services") or {}
    built = {svc.get("image") for svc in services.values() if isinstance(svc, dict) and svc.get("build")}
    names = []
    for name, svc in services.items():
        if not isinstance(svc, dict) or svc.get("command") or svc.get("entrypoint"):
            continue
        if svc.get("build") or (svc.get("image") is not None and svc.get("image") in built):
            names.append(name)
    return names


def exposed_ports(final: "Stage") -> set[int]:
    return {int(w.split("/")[0]) for ins in final.all("EXPOSE") for w in ins.args.split()}


def published_container_ports(service: dict[str, Any]) -> list[int]:
    ports = []
    for entry in service.get("ports") or []:
        if isinstance(entry, dict):
            ports.append(int(entry["target"]))
        else:
            container = str(entry).rsplit(":", 1)[-1].split("/")[0]
            ports.append(int(container))
    return ports


def healthcheck_text(service: dict[str, Any]) -> str:
    test = (service.get("healthcheck") or {}).get("test")
    if isinstance(test, list):
        if test and test[0] == "NONE":
            return ""
        return " ".join(test[1:]) if test and test[0] in ("CMD", "CMD-SHELL") else " ".join(test)
    return str(test or "")


@dataclass
class AgentListen:
    host: str
    port: int
    agents_dir: Path
    argv: list[str]


def agent_argv(command: Any, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The argv the agent service finally execs. A `python -c CODE` command is run here with
    os.execv/execvp intercepted, so the argv comes from the real gateway.demo code."""
    if isinstance(command, str):
        command = shlex.split(command)
    if len(command) >= 3 and Path(command[0]).name.startswith("python") and command[1] == "-c":
        captured: list[list[str]] = []

        class Exec(Exception):
            pass

        def fake_exec(_path: str, argv: list[str], *_: Any) -> None:
            captured.append([str(a) for a in argv])
            raise Exec

        for name in ("execv", "execvp", "execve", "execvpe"):
            monkeypatch.setattr(os, name, fake_exec)
        try:
            exec(compile(command[2], "<compose agent command>", "exec"), {"__name__": "__main__"})
        except Exec:
            pass
        assert captured, "the agent's `python -c` command never execs a server (os.execv was not called)"
        return captured[0]
    return [str(c) for c in command]


def agent_listen(argv: list[str]) -> AgentListen:
    def flag(name: str) -> str | None:
        for i, word in enumerate(argv):
            if word == name and i + 1 < len(argv):
                return argv[i + 1]
            if word.startswith(name + "="):
                return word.split("=", 1)[1]
        return None

    assert "api_server" in argv, f"the agent command does not run ADK's `api_server`: {argv}"
    port = flag("--port")
    assert port is not None, f"the agent command leaves the port to ADK's default; give --port explicitly: {argv}"
    return AgentListen(host=flag("--host") or "127.0.0.1", port=int(port), agents_dir=Path(argv[-1]), argv=argv)


# --------------------------------------------------------------------------------------------------
# fixtures


@pytest.fixture(scope="module")
def stages() -> list[Stage]:
    assert DOCKERFILE.is_file(), f"{DOCKERFILE} is missing"
    return read_dockerfile()


@pytest.fixture(scope="module")
def final(stages: list[Stage]) -> Stage:
    return stages[-1]


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    assert COMPOSE.is_file(), f"{COMPOSE} is missing"
    data = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))
    assert isinstance(data, dict) and isinstance(data.get("services"), dict), f"{COMPOSE}: no `services` mapping"
    assert "agent" in data["services"], f"{COMPOSE}: no `agent` service"
    assert gateway_service_names(data), (
        f"{COMPOSE}: no gateway service (one built from deploy/Dockerfile that runs its CMD, without a `command`)"
    )
    return data


def _gateway_params() -> list[str]:
    """Every gateway replica of compose.yaml, so the checks below run once per replica."""
    try:
        return gateway_service_names(yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))) or ["(no gateway service)"]
    except Exception:  # noqa: BLE001 - the `compose` fixture reports what is wrong with the file
        return ["(no gateway service)"]


@pytest.fixture(scope="module", params=_gateway_params())
def gateway_service(compose: dict[str, Any], request: pytest.FixtureRequest) -> dict[str, Any]:
    assert request.param in compose["services"], f"{COMPOSE}: no gateway service {request.param}"
    return compose["services"][request.param]


@pytest.fixture(scope="module")
def agent_service(compose: dict[str, Any]) -> dict[str, Any]:
    return compose["services"]["agent"]


@pytest.fixture(scope="module")
def pyproject() -> dict[str, Any]:
    return tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))


@pytest.fixture
def agent(agent_service: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> AgentListen:
    assert agent_service.get("command"), "the agent service has no `command`: it would run the gateway instead"
    return agent_listen(agent_argv(agent_service["command"], monkeypatch))


def container_env(final: Stage, gateway_service: dict[str, Any]) -> dict[str, str]:
    """The gateway container's environment under compose: the image's ENV, then compose's."""
    env = dict(final.env())
    env.update({k: v for k, v in service_env(gateway_service).items() if v is not None})
    return env


def image_env(final: Stage, gateway_service: dict[str, Any]) -> dict[str, str]:
    """The image's own ENV, plus only what any deployment must supply (config variables without a
    default, such as secrets), taken from compose."""
    required = {name for name, default in config_references().items() if default is None}
    # The image listens on 0.0.0.0, where anonymous access is refused: every deployment configures
    # auth (test_image_alone_refuses_anonymous_access checks the refusal).
    required |= AUTH_ENV
    env = {k: v for k, v in container_env(final, gateway_service).items() if k in required}
    env.update(final.env())
    return env


AUTH_ENV = {"AUTH_MODE", "GATEWAY_API_KEY"}


def test_image_alone_refuses_anonymous_access(final: Stage, gateway_service: dict[str, Any]) -> None:
    env = {k: v for k, v in image_env(final, gateway_service).items() if k not in AUTH_ENV}
    with pytest.raises(ConfigError) as info:
        load_config(CONFIG, env=env)
    assert any("auth.mode none is only allowed on a loopback listener" in p for p in info.value.problems)


def default_port(final: Stage, gateway_service: dict[str, Any]) -> int:
    """The port the image listens on when PORT is not set."""
    env = {k: v for k, v in image_env(final, gateway_service).items() if k != "PORT"}
    return load_config(CONFIG, env=env).listen.port


def resolve_dotted(path: str) -> Any:
    """`module.Class` or `module.instance`, imported the way ADK imports --extra_plugins."""
    module, _, attr = path.rpartition(".")
    return getattr(importlib.import_module(module), attr)


# --------------------------------------------------------------------------------------------------
# Dockerfile


def test_base_images_are_python_slim_satisfying_requires_python(stages: list[Stage], pyproject: dict) -> None:
    required = re.search(r">=\s*(\d+)\.(\d+)", pyproject["project"]["requires-python"])
    assert required, "pyproject.toml: requires-python has no lower bound to check against"
    minimum = (int(required.group(1)), int(required.group(2)))
    for stage in stages:
        if stage_named(stages[: stage.index], stage.base):
            continue  # FROM an earlier stage
        match = re.fullmatch(r"python:(\d+)\.(\d+)(?:\.\d+)?-slim(?:-\w+)?(?:@sha256:[0-9a-f]+)?", stage.base)
        assert match, f"Dockerfile: stage {stage.name or stage.index} is FROM {stage.base}, expected python:3.X-slim"
        version = (int(match.group(1)), int(match.group(2)))
        assert version >= minimum, (
            f"Dockerfile: {stage.base} is Python {version[0]}.{version[1]} but pyproject requires {minimum[0]}.{minimum[1]}+"
        )


def test_venv_copied_between_stages_comes_from_the_same_base(stages: list[Stage]) -> None:
    for copy in copies(stages):
        if copy.from_stage is None:
            continue
        source = stage_named(stages, copy.from_stage)
        if source is None:
            continue  # COPY --from=<image>: not a stage of this file
        assert image_of(stages, source) == image_of(stages, copy.stage), (
            f"Dockerfile:{copy.ins.line}: copies {copy.sources} from stage `{copy.from_stage}` "
            f"(image {image_of(stages, source)}) into a stage on {image_of(stages, copy.stage)}; a venv's "
            "interpreter links only work on the same base image"
        )


def lineage(stages: list[Stage], stage: Stage) -> list[Stage]:
    """The stage and the earlier stages it is built FROM, nearest first."""
    chain = [stage]
    while (parent := stage_named(stages[: chain[-1].index], chain[-1].base)) is not None:
        chain.append(parent)
    return chain


def image_of(stages: list[Stage], stage: Stage) -> str:
    """The image a stage stands on, through the stages it is built FROM."""
    return lineage(stages, stage)[-1].base


def test_copy_sources_exist_in_the_context_and_are_not_dockerignored(stages: list[Stage]) -> None:
    rules = dockerignore_rules()
    for copy in copies(stages):
        if copy.from_stage is not None:
            continue
        matched: list[Path] = []
        for source in copy.sources:
            assert not source.startswith(("/", "..")) and "://" not in source, (
                f"Dockerfile:{copy.ins.line}: source {source!r} is outside the build context (the repo root)"
            )
            if any(ch in source for ch in "*?["):
                matched += sorted(ROOT.glob(source))
                continue
            path = ROOT / source
            assert path.exists(), f"Dockerfile:{copy.ins.line}: {copy.ins.keyword} source {source!r} does not exist in {ROOT}"
            matched.append(path)
        assert matched, f"Dockerfile:{copy.ins.line}: none of {copy.sources} matches a file; the build would fail"
        for path in matched:
            rel = path.relative_to(ROOT).as_posix()
            if rel == ".":
                continue
            line = excluded_by(rel, rules)
            assert line is None, f"Dockerfile:{copy.ins.line} copies {rel} but .dockerignore line {line!r} leaves it out of the context"
            if path.is_dir():
                for file in path.rglob("*"):
                    if not file.is_file() or "__pycache__" in file.parts or file.suffix == ".pyc":
                        continue
                    if any(part.endswith(".egg-info") for part in file.parts):
                        continue  # an editable install's metadata (plugin/, `make`), git-ignored
                    inner = file.relative_to(ROOT).as_posix()
                    line = excluded_by(inner, rules)
                    assert line is None, (
                        f"Dockerfile:{copy.ins.line} copies {rel}/ but .dockerignore line {line!r} leaves {inner} out of the context"
                    )


def test_dockerignore_keeps_local_state_out_of_the_context() -> None:
    assert DOCKERIGNORE.is_file(), f"{DOCKERIGNORE} is missing: .venv and node_modules would be sent to the builder"
    rules = dockerignore_rules()
    for rel in (
        ".venv/bin/python", ".git/HEAD", "node_modules/x/index.js", "tests/js/node_modules/ai/package.json",
        "__pycache__/x.pyc", "gateway/demo/__pycache__", "artifacts/run.log",
    ):
        assert excluded_by(rel, rules), f".dockerignore does not exclude {rel}"


def test_build_stage_copies_everything_pip_needs(stages: list[Stage], pyproject: dict) -> None:
    installs = [
        (stage, ins) for stage in stages for ins in stage.all("RUN") if re.search(r"\bpip3? install\b", ins.args)
    ]
    assert installs, "Dockerfile: no `pip install` RUN: the project is never installed"
    # The gateway image (the last stage) carries the venv of these stages: no extras there (no ADK).
    daemon = {
        id(s) for c in copies([stages[-1]]) if c.from_stage is not None
        for source in [stage_named(stages, c.from_stage)] if source is not None for s in lineage(stages, source)
    }
    for stage, ins in installs:
        _pip_has_what_it_needs(stages, stage, ins, pyproject, extras_allowed=id(stage) not in daemon)


def _pip_has_what_it_needs(
    stages: list[Stage], stage: Stage, ins: Instruction, pyproject: dict, *, extras_allowed: bool
) -> None:
    # What this stage and the stages it is built FROM copied in.
    sources = [s for c in copies(lineage(stages, stage)) if c.from_stage is None for s in c.sources]

    def copied(rel: str) -> bool:
        return any(s in (".", "./") or rel == s.rstrip("/") or Path(rel).match(s) or rel.startswith(s.rstrip("/") + "/")
                   for s in sources)

    needed = ["pyproject.toml"]
    readme = pyproject["project"].get("readme")
    if isinstance(readme, str):
        needed.append(readme)
    includes = pyproject.get("tool", {}).get("setuptools", {}).get("packages", {}).get("find", {}).get("include", [])
    needed += sorted({pattern.split(".")[0].rstrip("*") for pattern in includes})
    for rel in needed:
        assert copied(rel), f"Dockerfile:{ins.line}: pip builds the project without {rel} (the stage only copies {sources})"

    args = ins.args
    assert "--no-cache-dir" in args or stage.env().get("PIP_NO_CACHE_DIR") not in (None, "0", "false"), (
        f"Dockerfile:{ins.line}: pip install keeps its cache in the image; add --no-cache-dir"
    )
    assert not re.search(r"\s(-e|--editable)\s", args), f"Dockerfile:{ins.line}: install the project, not editable: {args}"
    assert extras_allowed or "plugin" not in args, (
        f"Dockerfile:{ins.line}: the gateway image installs the ADK plugin, and with it google-adk: {args}"
    )
    assert extras_allowed or "[" not in args, (
        f"Dockerfile:{ins.line}: the gateway image's venv installs the daemon without extras (no ADK): {args}"
    )


def test_cmd_config_is_the_copied_reference_config(stages: list[Stage], final: Stage, gateway_service) -> None:
    cmd = final.last("CMD")
    assert cmd and cmd.exec_form(), "Dockerfile: the runtime stage needs an exec-form CMD (signals reach the gateway)"
    argv = cmd.exec_form()
    assert "--config" in argv, f"Dockerfile: CMD {argv} names no --config file"
    config_path = argv[argv.index("--config") + 1]
    landing = {copy_destination(c, s): (c, s) for c in copies([final]) if c.from_stage is None for s in c.sources}
    assert config_path in landing, f"Dockerfile: CMD reads {config_path}, but no COPY in the runtime stage puts a file there"
    copy, source = landing[config_path]
    assert (ROOT / source).resolve() == CONFIG.resolve(), (
        f"Dockerfile:{copy.ins.line}: {config_path} is copied from {source}, not the reference config {CONFIG.relative_to(ROOT)}"
    )
    assert load_config(ROOT / source, env=image_env(final, gateway_service)).listen.port > 0


def test_cmd_is_a_real_adk_gateway_subcommand(final: Stage, pyproject: dict, monkeypatch, capsys) -> None:
    argv = final.last("CMD").exec_form()
    scripts = pyproject["project"].get("scripts", {})
    assert argv[0] in scripts, f"Dockerfile: CMD runs {argv[0]!r}, which is not a console script of pyproject.toml {sorted(scripts)}"
    module, _, attr = scripts[argv[0]].partition(":")
    main = getattr(importlib.import_module(module), attr)

    class Parsed(Exception):
        pass

    parsed: list[argparse.Namespace] = []
    real_parse_args = argparse.ArgumentParser.parse_args

    def parse_only(self: argparse.ArgumentParser, args: Any = None, namespace: Any = None) -> argparse.Namespace:
        parsed.append(real_parse_args(self, args, namespace))
        raise Parsed  # stop before the command would start serving

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_only)
    try:
        main(argv[1:])
    except Parsed:
        pass
    except SystemExit as exc:
        pytest.fail(f"Dockerfile: `{shlex.join(argv)}` is refused by {scripts[argv[0]]} (exit {exc.code}): "
                    f"{capsys.readouterr().err.strip()}")
    assert parsed, f"{scripts[argv[0]]} never parsed its arguments"
    assert getattr(parsed[0], "command", argv[1]) == argv[1]


def test_runs_as_a_non_root_user(final: Stage) -> None:
    user = final.last("USER")
    assert user, "Dockerfile: the runtime stage has no USER, so the gateway runs as root"
    name = user.args.split(":")[0].strip()
    assert name not in ("root", "0", ""), f"Dockerfile:{user.line}: USER {user.args} is root"
    if not name.isdigit():
        created = any(re.search(rf"\b(useradd|adduser)\b.*\b{re.escape(name)}\b", i.args) for i in final.all("RUN"))
        assert created, f"Dockerfile:{user.line}: USER {name} is never created (useradd/adduser) in the runtime stage"


def test_expose_matches_the_config_default_port(final: Stage, gateway_service) -> None:
    exposed = {int(w.split("/")[0]) for ins in final.all("EXPOSE") for w in ins.args.split()}
    port = default_port(final, gateway_service)
    assert port in exposed, f"Dockerfile: EXPOSE {sorted(exposed)} but config/gateway.yaml listens on {port} by default"


def test_image_env_vars_are_ones_the_config_reads(final: Stage, gateway_service) -> None:
    refs = config_references()
    for name in final.env():
        if not RUNTIME_ENV.match(name):
            assert name in refs, f"Dockerfile: ENV {name} is set but config/gateway.yaml never references ${{{name}}}"
    config = load_config(CONFIG, env=image_env(final, gateway_service))
    assert config.listen.host not in LOOPBACK, (
        f"Dockerfile: with the image's ENV the gateway listens on {config.listen.host}, unreachable from outside the container"
    )


class _Stub(http.server.BaseHTTPRequestHandler):
    status = 200
    paths: list[str] = []

    def do_GET(self) -> None:  # noqa: N802
        type(self).paths.append(self.path)
        self.send_response(self.status if self.path == "/healthz" else 404)
        self.end_headers()

    def log_message(self, *_: Any) -> None:
        pass


@pytest.fixture
def stub_gateway() -> Iterator[tuple[int, type[_Stub]]]:
    handler = type("Handler", (_Stub,), {"status": 200, "paths": []})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1], handler
    finally:
        server.shutdown()
        server.server_close()


def _run_healthcheck(ins: Instruction, port: int, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    words = shlex.split(ins.args)
    while words and words[0].startswith("--"):
        words.pop(0)
    assert words and words[0].upper() == "CMD", f"Dockerfile:{ins.line}: HEALTHCHECK without CMD"
    rest = ins.args[ins.args.upper().index("CMD") + 3 :].strip()
    argv = Instruction("CMD", rest, ins.line).exec_form() or ["/bin/sh", "-c", rest]
    # `python` in the image is the venv's; here it is the interpreter running the tests.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    if not (bin_dir / "python").exists():
        (bin_dir / "python").symlink_to(sys.executable)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}", "PORT": str(port)}
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=30)


def test_healthcheck_probes_healthz_and_fails_when_unhealthy(final: Stage, stub_gateway, tmp_path: Path) -> None:
    ins = final.last("HEALTHCHECK")
    assert ins and not ins.args.upper().startswith("NONE"), "Dockerfile: the runtime stage has no HEALTHCHECK"
    assert "/healthz" in ins.args, f"Dockerfile:{ins.line}: HEALTHCHECK does not probe /healthz: {ins.args}"
    assert not re.search(r"\b(curl|wget)\b", ins.args), f"Dockerfile:{ins.line}: python:3.11-slim has no curl/wget"
    port, handler = stub_gateway
    ok = _run_healthcheck(ins, port, tmp_path)
    assert ok.returncode == 0, (
        f"Dockerfile:{ins.line}: HEALTHCHECK fails against a healthy gateway on $PORT={port} "
        f"(requests seen: {handler.paths}): {ok.stderr.strip()[-500:]}"
    )
    assert handler.paths == ["/healthz"], f"HEALTHCHECK requested {handler.paths}, expected one GET /healthz"
    handler.status = 503
    assert _run_healthcheck(ins, port, tmp_path).returncode != 0, (
        f"Dockerfile:{ins.line}: HEALTHCHECK passes although /healthz answers 503"
    )


def test_the_gateway_serves_the_route_the_healthcheck_probes(final: Stage) -> None:
    from gateway.edge.app import create_app
    from gateway.config.schema import GatewayConfig

    probed = re.findall(r"/[A-Za-z0-9_-]+(?=['\"?])", final.last("HEALTHCHECK").args)
    routes = {r.resource.canonical for r in create_app(GatewayConfig()).router.routes() if r.method == "GET"}
    assert probed and set(probed) <= routes, (
        f"Dockerfile: HEALTHCHECK requests {probed} but the gateway's GET routes are {sorted(routes)}"
    )


# --------------------------------------------------------------------------------------------------
# compose.yaml


def test_compose_build_paths_exist_and_build_this_dockerfile(compose: dict[str, Any]) -> None:
    for name, service in compose["services"].items():
        build = service.get("build")
        if build is None:
            continue
        if isinstance(build, str):
            build = {"context": build}
        context = (COMPOSE.parent / build.get("context", ".")).resolve()
        assert context.is_dir(), f"compose.yaml: service {name} builds from {context}, which does not exist"
        assert context == ROOT, (
            f"compose.yaml: service {name} builds with context {context}, but the Dockerfile's COPY paths are relative to {ROOT}"
        )
        dockerfile = (context / build.get("dockerfile", "Dockerfile")).resolve()
        assert dockerfile == DOCKERFILE.resolve(), f"compose.yaml: service {name} builds {dockerfile}, not {DOCKERFILE}"
    for name in ["agent", *gateway_service_names(compose)]:
        service = compose["services"][name]
        assert service.get("build") or service.get("image"), f"compose.yaml: service {name} has neither build nor image"


# Variables of config sections being added while compose.yaml already sets them (the Redis session
# backend: sessions.backend / sessions.redis_url). Tolerated only while gateway.config has no such
# section; once it has, config/gateway.yaml must read them like any other variable.
PENDING_CONFIG_VARS = {"SESSIONS_BACKEND": "sessions", "REDIS_URL": "sessions"}


def pending_config_var(name: str, refs: dict[str, str | None]) -> bool:
    from gateway.config.schema import GatewayConfig

    section = PENDING_CONFIG_VARS.get(name)
    return name not in refs and section is not None and section not in GatewayConfig.model_fields


def test_gateway_env_vars_are_ones_the_config_reads(gateway_service: dict[str, Any]) -> None:
    refs = config_references()
    for name in service_env(gateway_service):
        if pending_config_var(name, refs):
            continue
        assert name in refs, (
            f"compose.yaml: the gateway is given {name}, but config/gateway.yaml never references ${{{name}}} "
            f"(it reads {sorted(refs)})"
        )


def test_config_vars_without_default_are_set(final: Stage, gateway_service: dict[str, Any]) -> None:
    env = container_env(final, gateway_service)
    for name, default in config_references().items():
        if default is None:
            assert name in env, (
                f"config/gateway.yaml needs ${{{name}}} (no default) but neither compose.yaml's gateway nor the image sets it"
            )


def test_published_port_is_the_gateway_port(final: Stage, gateway_service: dict[str, Any]) -> None:
    env = container_env(final, gateway_service)
    port = int(env.get("PORT", default_port(final, gateway_service)))
    published = published_container_ports(gateway_service)
    # Behind the load balancer a replica publishes nothing: tests/test_ops_kit.py checks that the
    # balancer publishes a port and forwards it to every replica's listen port.
    assert set(published) <= {port}, f"compose.yaml: the gateway listens on PORT={port} but publishes container port(s) {published}"
    exposed = exposed_ports(final)
    assert port in exposed, f"compose.yaml: the gateway listens on {port} but the Dockerfile EXPOSEs {sorted(exposed)}"


def test_the_agent_keeps_its_adk_sessions_in_sqlite_on_a_named_volume(
    agent: AgentListen, agent_service: dict[str, Any], compose: dict[str, Any], stages: list[Stage]
) -> None:
    """Issue 25: with memory:// an agent restart lost every confirmation a person had not answered."""
    uri = agent.argv[agent.argv.index("--session_service_uri") + 1]
    assert uri.startswith("sqlite:////"), f"compose.yaml: the agent's sessions are not in a SQLite file: {uri}"
    folder = Path(uri.removeprefix("sqlite:///")).parent
    mounts = {m.split(":")[1]: m.split(":")[0] for m in agent_service.get("volumes", []) if isinstance(m, str)}
    assert str(folder) in mounts, f"compose.yaml: the agent's session store {folder} is not on a volume: {mounts}"
    assert mounts[str(folder)] in (compose.get("volumes") or {}), "compose.yaml: the sessions' volume is not a named volume"
    agent_stage = stage_named(stages, "agent")
    assert agent_stage is not None
    made = " ".join(i.args for i in agent_stage.all("RUN"))
    # A named volume takes the owner of the image's folder: the non-root agent must own it.
    assert f"-o 10001 -g 10001 -m 0750 {folder}" in made, "deploy/Dockerfile: the agent stage does not make the sessions' folder"


def test_agent_runs_the_stock_adk_server_reachable_from_the_gateway(agent: AgentListen, gateway_service) -> None:
    assert agent.host not in LOOPBACK, f"compose.yaml: the agent listens on {agent.host}, unreachable from the gateway container"
    env = service_env(gateway_service)
    assert (agent.agents_dir / (env.get("ADK_APP_NAME") or "demo_agent")).is_dir(), (
        f"compose.yaml: ADK_APP_NAME={env.get('ADK_APP_NAME')!r} is not an app in the agent's folder {agent.agents_dir}"
    )
    assert "--reload" not in agent.argv, "compose.yaml: the agent runs ADK with auto-reload"


def test_upstream_url_points_at_the_agent_service(compose, gateway_service, agent: AgentListen) -> None:
    url = service_env(gateway_service).get("ADK_UPSTREAM_URL")
    assert url, "compose.yaml: the gateway has no ADK_UPSTREAM_URL, so it would look for ADK on its own loopback"
    parts = urlsplit(url)
    assert parts.hostname in compose["services"], (
        f"compose.yaml: ADK_UPSTREAM_URL host {parts.hostname!r} is not a service ({sorted(compose['services'])})"
    )
    assert parts.hostname == "agent", f"compose.yaml: ADK_UPSTREAM_URL points at {parts.hostname!r}, not the agent service"
    assert (parts.port or 80) == agent.port, (
        f"compose.yaml: ADK_UPSTREAM_URL uses port {parts.port or 80} but the agent command listens on {agent.port}"
    )


def _adk_get_routes_source() -> str:
    spec = importlib.util.find_spec("google.adk.cli")
    assert spec and spec.submodule_search_locations, "google-adk is not installed"
    folder = Path(list(spec.submodule_search_locations)[0])
    return "\n".join(p.read_text(encoding="utf-8", errors="replace") for p in folder.rglob("*.py"))


def test_agent_healthcheck_probes_an_adk_route(agent_service: dict[str, Any], agent: AgentListen) -> None:
    text = healthcheck_text(agent_service)
    assert text, "compose.yaml: the agent has no healthcheck, so `condition: service_healthy` can never hold"
    match = re.search(r"https?://([^/:'\"\s]+)(?::(\d+))?(/[^'\"\s?]*)", text)
    assert match, f"compose.yaml: cannot find the URL the agent healthcheck requests: {text}"
    host, port, path = match.group(1), int(match.group(2) or 80), match.group(3)
    assert host in LOOPBACK, f"compose.yaml: the agent healthcheck probes {host}, not the agent's own loopback"
    assert port == agent.port, f"compose.yaml: the agent healthcheck probes port {port} but the agent listens on {agent.port}"
    route = re.compile(rf"\.(?:get|api_route)\(\s*[\"']{re.escape(path)}[\"']")
    assert route.search(_adk_get_routes_source()), (
        f"compose.yaml: the agent healthcheck probes {path}, which is not a GET route of the installed ADK API server"
    )
    assert not re.search(r"\b(curl|wget)\b", text), "compose.yaml: the image (python:3.11-slim) has no curl/wget"


def test_gateway_waits_for_a_healthy_agent(gateway_service: dict[str, Any]) -> None:
    depends = gateway_service.get("depends_on")
    assert isinstance(depends, dict) and "agent" in depends, "compose.yaml: the gateway does not depend on the agent"
    assert depends["agent"].get("condition") == "service_healthy", (
        "compose.yaml: the gateway starts before the agent answers (use condition: service_healthy)"
    )


def test_reference_config_loads_with_the_container_environment(final: Stage, gateway_service, agent: AgentListen) -> None:
    env = container_env(final, gateway_service)
    config = load_config(CONFIG, env=env)  # what `adk-gateway check-config` does, with the container's env
    reached = published_container_ports(gateway_service) or sorted(exposed_ports(final))
    assert config.listen.port in reached, (
        f"with the compose env the gateway listens on {config.listen.port} but compose publishes / the image exposes {reached}"
    )
    assert config.listen.host not in LOOPBACK, f"with the container env the gateway listens on {config.listen.host} only"
    for name, served in config.agents.items():
        assert served.upstream_base == env["ADK_UPSTREAM_URL"].rstrip("/"), (
            f"agents.{name}: upstream {served.upstream_base} differs from ADK_UPSTREAM_URL {env['ADK_UPSTREAM_URL']}"
        )
        assert urlsplit(served.upstream_base).port == agent.port
        assert (agent.agents_dir / served.upstream.app_name).is_dir(), (
            f"agents.{name}.upstream.app_name {served.upstream.app_name!r} is not served by the agent ({agent.agents_dir})"
        )


def _gated_tools(final: Stage, gateway_service: dict[str, Any]) -> list[str]:
    config = load_config(CONFIG, env=container_env(final, gateway_service))
    return sorted({name for served in config.agents.values() for name, policy in served.tools.items() if policy.gated})


def _plugins(agent: AgentListen) -> list[str]:
    return [agent.argv[i + 1] for i, word in enumerate(agent.argv[:-1]) if word == "--extra_plugins"]


def test_agent_plugins_import(agent: AgentListen) -> None:
    # ADK only logs an error when an --extra_plugins path fails to import, and runs without it.
    from google.adk.plugins.base_plugin import BasePlugin

    for path in _plugins(agent):
        try:
            plugin = resolve_dotted(path)
        except (ImportError, AttributeError) as exc:
            pytest.fail(f"compose.yaml: the agent loads --extra_plugins {path}, which does not import: {exc}")
        ok = isinstance(plugin, BasePlugin) or (isinstance(plugin, type) and issubclass(plugin, BasePlugin))
        assert ok, f"compose.yaml: --extra_plugins {path} is not an ADK BasePlugin"


def test_agent_loads_the_gateway_plugin_when_the_config_gates_tools(final, gateway_service, agent: AgentListen) -> None:
    gated = _gated_tools(final, gateway_service)
    if not gated:
        return
    from gateway.agent_plugin import GatewayPlugin

    loaded = [p for p in _plugins(agent) if p.rpartition(".")[0] == GatewayPlugin.__module__]
    assert loaded, (
        f"config/gateway.yaml gates {gated} but the agent does not load the gateway's ADK plugin "
        f"({GatewayPlugin.__module__}.{GatewayPlugin.__name__}), so those calls would run unchecked"
    )


def test_plugin_reaches_the_gateway_internal_listener(compose, final, gateway_service, agent_service, agent) -> None:
    from gateway.agent_plugin import GatewayPlugin

    if not any(p.rpartition(".")[0] == GatewayPlugin.__module__ for p in _plugins(agent)):
        return
    config = load_config(CONFIG, env=container_env(final, gateway_service))
    agent_env = service_env(agent_service)
    url = agent_env.get("ADK_GATEWAY_URL")
    assert url, "compose.yaml: the agent runs the gateway plugin without ADK_GATEWAY_URL (it would call its own loopback)"
    parts = urlsplit(url)
    gateways = gateway_service_names(compose)
    assert parts.hostname in compose["services"], (
        f"compose.yaml: ADK_GATEWAY_URL points at {parts.hostname!r}, which is not a service ({sorted(compose['services'])})"
    )
    if parts.hostname in gateways:
        assert len(gateways) == 1, (
            f"compose.yaml: ADK_GATEWAY_URL points at replica {parts.hostname!r} only, but gated calls may belong to any of {gateways}"
        )
        assert parts.port == config.internal.port, (
            f"compose.yaml: ADK_GATEWAY_URL uses port {parts.port} but the gateway's internal listener is on {config.internal.port}"
        )
    # Otherwise it is the load balancer: tests/test_ops_kit.py checks that it forwards that port to
    # every replica's internal.port.
    assert config.internal.host not in LOOPBACK, (
        f"compose.yaml: the gateway's internal listener binds {config.internal.host}, unreachable from the agent container"
    )
    assert config.internal.port not in published_container_ports(gateway_service), (
        "compose.yaml: the gateway publishes its internal (plugin) port to the host"
    )
    assert config.internal.secret is not None, "the gateway has no internal.secret, so it does not start its internal listener"
    secret = config.internal.secret.get_secret_value()
    assert secret and agent_env.get("ADK_GATEWAY_SECRET") == secret, (
        "compose.yaml: the agent's ADK_GATEWAY_SECRET is not the gateway's internal.secret; every gated call would be refused"
    )


def test_agent_env_vars_are_read_by_the_agent_process(agent_service: dict[str, Any]) -> None:
    # The agent process runs the demo agent (gateway/demo) and the plugin (plugin/, its own distribution).
    files = [*(ROOT / "gateway").rglob("*.py"), *(ROOT / "plugin").rglob("*.py")]
    source = "\n".join(p.read_text(encoding="utf-8") for p in files)
    for name in service_env(agent_service):
        read = re.search(rf"environ(?:\.get\(|\.setdefault\(|\[)\s*[\"']{re.escape(name)}[\"']", source)
        assert read, f"compose.yaml: the agent is given {name}, but nothing in gateway/ or plugin/ reads it from the environment"


def test_the_daemon_depends_on_no_adk(pyproject: dict) -> None:
    """`pip install adk-gateway` installs the daemon only: ADK comes with the demo extra (issue 15)."""
    names = [re.split(r"[\[<>=!~ ;]", dep, maxsplit=1)[0].lower() for dep in pyproject["project"]["dependencies"]]
    assert not {"google-adk", "google-genai", "uvicorn"} & set(names), names
    assert any(dep.startswith("google-adk") for dep in pyproject["project"]["optional-dependencies"]["demo"])


# --------------------------------------------------------------------------------------------------
# The example agent image (deploy/kubernetes/agent.Dockerfile) and the Dockerfiles the docs show


AGENT_EXAMPLE = ROOT / "deploy" / "kubernetes" / "agent.Dockerfile"
# `pip install` arguments that are local paths (a requirement spec never starts with / or .).
PIP_INSTALL = re.compile(r"\bpip3?\s+install\b([^;&|]*)")


def named_build_contexts(path: Path) -> set[str]:
    """The `--build-context NAME=...` of the build command the file's header gives."""
    return set(re.findall(r"--build-context\s+([A-Za-z0-9_.-]+)=", path.read_text(encoding="utf-8")))


def docs_dockerfiles() -> list[tuple[str, str]]:
    """(where, text) of every ```dockerfile block of docs/ and the READMEs."""
    found = []
    for doc in sorted([*(ROOT / "docs").glob("*.md"), *ROOT.glob("*.md"), *(ROOT / "deploy").rglob("*.md")]):
        for n, block in enumerate(re.findall(r"```dockerfile\n(.*?)```", doc.read_text(encoding="utf-8"), re.S)):
            found.append((f"{doc.relative_to(ROOT)} block {n + 1}", block))
    return found


def pip_paths_not_copied_first(stages: list[Stage]) -> list[str]:
    """Each local path a RUN's pip install names that no earlier COPY/ADD of its stage put there."""
    problems = []
    for stage in stages:
        copied: list[str] = []
        workdir = "/"
        for ins in stage.instructions:
            if ins.keyword == "WORKDIR":
                workdir = str(Path(workdir) / ins.args.strip())
            if ins.keyword in ("COPY", "ADD"):
                (c,) = [c for c in copies([stage]) if c.ins is ins]
                copied += [copy_destination(c, source) if source != "." else c.dest for source in c.sources]
            if ins.keyword != "RUN":
                continue
            for args in PIP_INSTALL.findall(ins.args):
                for word in shlex.split(args.replace("\\", " "), comments=True):
                    if not word.startswith(("/", ".")):
                        continue
                    path = os.path.normpath(str(Path(workdir) / word.split("[")[0].strip("'\"")))
                    if not any(path == d.rstrip("/") or path.startswith(d.rstrip("/") + "/") for d in copied):
                        problems.append(f"line {ins.line}: pip installs {word}, which no earlier COPY put at {path}")
    return problems


def test_the_example_agent_dockerfile_builds_from_its_contexts() -> None:
    """Every COPY source is in the repository (the build context) and not .dockerignored, or comes
    from a stage or a named context its build command gives; every path pip installs was copied."""
    stages = read_dockerfile(AGENT_EXAMPLE)
    named, rules = named_build_contexts(AGENT_EXAMPLE), dockerignore_rules()
    assert re.search(r"docker build -f deploy/kubernetes/agent\.Dockerfile .*\.\s*$",
                     AGENT_EXAMPLE.read_text(encoding="utf-8").replace("\\\n#", ""), re.M), (
        "agent.Dockerfile: its build command does not name the repository root as the context"
    )
    for c in copies(stages):
        if c.from_stage is not None:
            assert stage_named(stages, c.from_stage) or c.from_stage in named, (
                f"agent.Dockerfile:{c.ins.line}: COPY --from={c.from_stage} is neither a stage nor a named build context"
            )
            continue
        for source in c.sources:
            assert (ROOT / source).exists(), f"agent.Dockerfile:{c.ins.line}: COPY {source}: not in the build context"
            assert not excluded_by(source, rules), f"agent.Dockerfile:{c.ins.line}: COPY {source}: .dockerignore keeps it out"
    assert not pip_paths_not_copied_first(stages), pip_paths_not_copied_first(stages)
    assert stages[-1].last("USER") is not None and stages[-1].last("USER").args.startswith("10001")


@pytest.mark.parametrize("where, text", docs_dockerfiles() or [("no block", "FROM scratch\n")])
def test_a_dockerfile_in_the_docs_copies_what_it_installs(where: str, text: str, tmp_path: Path) -> None:
    path = tmp_path / "Dockerfile"
    path.write_text(text, encoding="utf-8")
    problems = pip_paths_not_copied_first(read_dockerfile(path))
    assert not problems, f"{where}: {problems}"


# --------------------------------------------------------------------------------------------------
# ADK's session database URL: one spelling everywhere an operator copies it from

SESSION_DB_URL = re.compile(r"\b(sqlite|postgres(?:ql)?|mysql|mariadb)(\+[a-z0-9]+)?://(/*)")
# A file: sqlite:////absolute/path (four slashes; ADK strips one). A server: the asyncio driver
# named, as ADK's SQLAlchemy engine needs (postgresql+asyncpg://, for MySQL mysql+aiomysql://).
SESSION_DB_FORMS = {("sqlite", None, "//"), ("postgresql", "+asyncpg", ""), ("mysql", "+aiomysql", "")}


def session_db_urls_off_the_form() -> list[str]:
    files = [ROOT / "README.md", ROOT / "Makefile", *(ROOT / "docs").glob("*.md"), *(ROOT / "config").iterdir(),
             *(p for p in (ROOT / "deploy").rglob("*")
               # Bytecode a test wrote beside deploy/kubernetes/generate_prometheusrule.py is no operator's copy.
               if p.is_file() and p.suffix not in (".json", ".pyc") and "__pycache__" not in p.parts)]
    problems = []
    for path in files:
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for match in SESSION_DB_URL.finditer(line):
                if match.groups() not in SESSION_DB_FORMS:
                    problems.append(f"{path.relative_to(ROOT)}:{n}: {match.group(0)}")
    return problems


def test_one_spelling_of_the_session_database_url() -> None:
    problems = session_db_urls_off_the_form()
    assert not problems, "sqlite:////absolute/path or postgresql+asyncpg://user:password@host:5432/db:\n" + "\n".join(problems)
