"""The operations kit in deploy/: compose.yaml, nginx, Prometheus and its alert rules, Grafana.

There is no Docker engine where the tests run, so the files are held against what they operate:

- Metric names: a real gateway process is scraped, and every metric that the Grafana dashboard and
  the Prometheus alert rules name (with histogram suffixes, plus Prometheus's own `up`) must be one
  it exports, with the labels used in matchers, `by (...)` clauses, legends and `$labels` existing
  on those metrics. The PromQL is tokenized, not grepped.
- compose.yaml: every mounted file exists and the container paths the services read resolve
  through the mounts; nginx's upstreams hold exactly the gateway replicas on the ports their config
  listens on; the balancer publishes the browser port and not the internal one; the agent's plugin
  goes through the balancer's internal port; Prometheus scrapes every replica on the metrics path;
  Grafana's datasource is the Prometheus service; the environment given to the replicas is read by
  the config; Redis is where REDIS_URL points.
- nginx.conf is parsed (blocks, upstreams, listen, locations, proxy_* with nginx's inheritance
  rules) and every gateway route is matched to its location the way nginx does: the WebSocket route
  must upgrade, SSE routes must not be buffered, timeouts must outlast keep-alives, heartbeats and
  approval timeouts, bodies up to chat.max_body_bytes must pass, /metrics must stay private.
- Every check returns its problems as sentences; `test_each_check_reports_a_broken_copy` runs the
  checks against copies of deploy/ with one thing broken each and requires the matching problem,
  so no check here can silently pass everything.
- When nginx is installed, the real nginx.conf (service names and ports mapped to loopback) runs in
  front of two real gateways: SSE arrives unbuffered, WebSockets upgrade same-origin, large bodies
  pass, /metrics is refused, the internal port reaches every replica.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shlex
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import pytest
import yaml

from gateway.config.schema import ConfigError, GatewayConfig, load_config
from tests.procs import free_port, gateway_process, metric_value, stop_process
from tests.test_deploy_files import (
    CONFIG,
    DOCKERFILE,
    ROOT,
    LOOPBACK,
    Stage,
    config_references,
    container_env,
    gateway_service_names,
    pending_config_var,
    published_container_ports,
    read_dockerfile,
    service_env,
)

DEPLOY = ROOT / "deploy"

# --------------------------------------------------------------------------------------------------
# PromQL: a tokenizer and just enough of the grammar to find metric names, label matchers, grouping
# labels, function names and range durations.

PROMQL_AGGREGATIONS = frozenset(
    "sum min max avg group stddev stdvar count count_values bottomk topk quantile limitk limit_ratio".split()
)
PROMQL_FUNCTIONS = frozenset(
    """abs absent absent_over_time ceil changes clamp clamp_max clamp_min day_of_month day_of_week day_of_year
    days_in_month delta deriv exp floor histogram_avg histogram_count histogram_fraction histogram_quantile
    histogram_stddev histogram_stdvar histogram_sum holt_winters double_exponential_smoothing hour idelta increase
    irate label_join label_replace ln log2 log10 minute month predict_linear rate resets round scalar sgn sort
    sort_desc sort_by_label sort_by_label_desc sqrt time timestamp vector year avg_over_time min_over_time
    max_over_time sum_over_time count_over_time quantile_over_time stddev_over_time stdvar_over_time
    last_over_time present_over_time mad_over_time acos acosh asin asinh atan atanh cos cosh sin sinh tan tanh
    deg pi rad""".split()
)
PROMQL_GROUPING = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right"})
PROMQL_KEYWORDS = frozenset({"bool", "and", "or", "unless", "offset", "atan2", "inf", "nan", "start", "end"})
# Labels Prometheus attaches to every scraped series.
TARGET_LABELS = frozenset({"job", "instance"})
# Series Prometheus makes itself for each target, besides what the target exports.
PROMETHEUS_SERIES = frozenset({"up"})

_PROMQL_TOKEN = re.compile(
    r"""
    (?P<ws>\s+|\#[^\n]*)
    |(?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`)
    |(?P<var>\$\{[^}]+\}|\$[A-Za-z_][A-Za-z0-9_]*)
    |(?P<duration>(?:\d+(?:ms|[smhdwy]))+\b)
    |(?P<number>0x[0-9a-fA-F]+|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)
    |(?P<ident>[A-Za-z_:][A-Za-z0-9_:]*)
    |(?P<op>=~|!~|!=|==|<=|>=|[-+*/%^<>=(){}\[\],@:])
    """,
    re.X,
)


@dataclass
class Selector:
    metric: str | None
    matchers: list[tuple[str, str, str]]  # (label, op, value)


@dataclass
class PromQL:
    expr: str
    selectors: list[Selector] = field(default_factory=list)
    grouping: set[str] = field(default_factory=set)
    functions: set[str] = field(default_factory=set)
    ranges: list[str] = field(default_factory=list)

    @property
    def metrics(self) -> set[str]:
        return {s.metric for s in self.selectors if s.metric}


def _promql_tokens(expr: str) -> list[tuple[str, str]]:
    tokens, pos = [], 0
    while pos < len(expr):
        match = _PROMQL_TOKEN.match(expr, pos)
        if not match:
            raise ValueError(f"unexpected character {expr[pos]!r} at {pos}")
        pos = match.end()
        if match.lastgroup != "ws":
            tokens.append((match.lastgroup or "", match.group()))
    return tokens


def _unquote(token: str) -> str:
    return token[1:-1] if token[0] == "`" else str(ast.literal_eval(token))  # Go's escapes, as far as PromQL uses them


def parse_promql(expr: str) -> PromQL:
    """Metric names, matchers, grouping labels, functions and ranges of one PromQL expression."""
    tokens = _promql_tokens(expr)
    out = PromQL(expr)
    depth = 0
    i = 0

    def text(j: int) -> str:
        return tokens[j][1] if j < len(tokens) else ""

    def matchers(j: int) -> tuple[list[tuple[str, str, str]], int]:
        assert text(j) == "{"
        found, j = [], j + 1
        while text(j) != "}":
            kind, label = tokens[j] if j < len(tokens) else ("", "")
            if kind == "string":
                label = _unquote(label)
            elif kind != "ident":
                raise ValueError(f"expected a label name in a selector, got {label!r}")
            op, value = text(j + 1), tokens[j + 2] if j + 2 < len(tokens) else ("", "")
            if op not in ("=", "!=", "=~", "!~") or value[0] != "string":
                raise ValueError(f"bad label matcher after {label!r}")
            found.append((label, op, _unquote(value[1])))
            j += 3
            if text(j) == ",":
                j += 1
            elif text(j) != "}":
                raise ValueError(f"expected , or }} after the matcher on {label!r}")
        return found, j + 1

    while i < len(tokens):
        kind, tok = tokens[i]
        if tok == "[":
            end = i + 1
            while end < len(tokens) and text(end) != "]":
                end += 1
            if end == len(tokens):
                raise ValueError("unclosed [")
            out.ranges.append("".join(t for _, t in tokens[i + 1 : end]))
            i = end + 1
            continue
        if tok == "{":
            found, i = matchers(i)
            names = [v for label, op, v in found if label == "__name__" and op == "="]
            out.selectors.append(Selector(names[0] if names else None, found))
            continue
        if tok == "(":
            depth += 1
        elif tok == ")":
            depth -= 1
            if depth < 0:
                raise ValueError("unbalanced )")
        elif kind == "ident":
            low = tok.lower()
            following = text(i + 1)
            if low in PROMQL_GROUPING:
                i += 1
                if text(i) == "(":
                    i += 1
                    while text(i) != ")":
                        if i >= len(tokens) or (tokens[i][0] not in ("ident", "string") and text(i) != ","):
                            raise ValueError(f"bad label list after {tok}")
                        if tokens[i][0] in ("ident", "string"):
                            out.grouping.add(_unquote(text(i)) if tokens[i][0] == "string" else text(i))
                        i += 1
                    i += 1
                continue
            if low in PROMQL_KEYWORDS:
                i += 1
                continue
            if following == "(" or (low in PROMQL_AGGREGATIONS and following.lower() in ("by", "without")):
                out.functions.add(tok)
                i += 1
                continue
            if following == "{":
                found, i = matchers(i + 1)
                out.selectors.append(Selector(tok, found))
                continue
            out.selectors.append(Selector(tok, []))
        i += 1
    if depth != 0:
        raise ValueError("unbalanced parentheses")
    return out


_PROM_DURATION = re.compile(r"(\d+)(ms|[smhdwy])")
_PROM_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}


def prom_duration(text: str) -> float:
    text = str(text).strip()
    parts = _PROM_DURATION.findall(text)
    if not parts or "".join(a + b for a, b in parts) != text:
        raise ValueError(f"not a Prometheus duration: {text!r}")
    return sum(int(n) * _PROM_UNITS[u] for n, u in parts)


# --------------------------------------------------------------------------------------------------
# The gateway's exposition: metric names (from # TYPE lines, so families without samples count) and
# the labels of each series name.

def exported_series(exposition: str) -> dict[str, set[str]]:
    """Every series name a scrape can return -> its label names (le for buckets)."""
    series: dict[str, set[str]] = {}
    for line in exposition.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(None, 3)
            base = name.removesuffix("_total") if kind == "counter" else name
            names = {
                "counter": [f"{base}_total", f"{base}_created"],
                "histogram": [f"{name}_bucket", f"{name}_sum", f"{name}_count", f"{name}_created"],
                "summary": [name, f"{name}_sum", f"{name}_count", f"{name}_created"],
            }.get(kind, [name])
            for n in names:
                series.setdefault(n, set())
            if kind == "histogram":
                series[f"{name}_bucket"].add("le")
        elif line and not line.startswith("#"):
            match = re.match(r"([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(.*)\})?\s", line)
            if match:
                labels = set(re.findall(r'([A-Za-z_][A-Za-z0-9_]*)="', match.group(2) or ""))
                series.setdefault(match.group(1), set()).update(labels)
    return series


def declared_labels() -> dict[str, set[str]]:
    """Series name -> label names, from the metric objects of gateway/ops/metrics.py and its parts (a labelled metric
    with no child yet has no sample in a scrape to read its labels from)."""
    from prometheus_client.metrics import MetricWrapperBase

    from gateway.ops.metrics import GatewayMetrics

    out: dict[str, set[str]] = {}
    metrics = GatewayMetrics()
    # The series of GatewayMetrics and of the groups it holds (its webhooks' WebhookMetrics).
    held = [*vars(metrics).values(), *(v for part in vars(metrics).values() if hasattr(part, "__dict__") for v in vars(part).values())]
    for metric in held:
        if not isinstance(metric, MetricWrapperBase):
            continue
        for family in metric.describe():
            text = f"# TYPE {family.name}{'_total' if family.type == 'counter' else ''} {family.type}\n"
            for name in exported_series(text):
                out.setdefault(name, set()).update(metric._labelnames)  # noqa: SLF001 - the declared contract
    return out


# --------------------------------------------------------------------------------------------------
# nginx.conf: blocks and directives, upstreams, listen ports, location matching and inheritance.

@dataclass
class Directive:
    name: str
    args: list[str]
    line: int
    children: list[Directive] | None = None

    def all(self, name: str) -> list[Directive]:
        return [d for d in self.children or [] if d.name == name]

    def first(self, name: str) -> Directive | None:
        found = self.all(name)
        return found[0] if found else None


def parse_nginx(text: str) -> Directive:
    """The whole file as a root block. Quotes, comments, blocks; no includes (the kit has none)."""
    tokens: list[tuple[str, int, bool]] = []  # (text, line, quoted)
    i, line = 0, 1
    while i < len(text):
        ch = text[i]
        if ch == "\n":
            line += 1
            i += 1
        elif ch.isspace():
            i += 1
        elif ch == "#":
            while i < len(text) and text[i] != "\n":
                i += 1
        elif ch in "{};":
            tokens.append((ch, line, False))
            i += 1
        elif ch in "'\"":
            end, buf = i + 1, []
            while end < len(text) and text[end] != ch:
                if text[end] == "\\" and end + 1 < len(text):
                    end += 1
                buf.append(text[end])
                line += text[end] == "\n"
                end += 1
            if end >= len(text):
                raise ValueError(f"nginx.conf:{line}: unclosed quote")
            tokens.append(("".join(buf), line, True))
            i = end + 1
        else:
            end = i
            while end < len(text) and not text[end].isspace() and text[end] not in "{};":
                end += 1
            tokens.append((text[i:end], line, False))
            i = end
    root = Directive("", [], 0, [])
    stack = [root]
    words: list[tuple[str, int, bool]] = []
    for tok, ln, quoted in tokens:
        if not quoted and tok == ";":
            if not words:
                raise ValueError(f"nginx.conf:{ln}: empty directive")
            stack[-1].children.append(Directive(words[0][0], [w for w, _, _ in words[1:]], words[0][1]))  # type: ignore[union-attr]
            words = []
        elif not quoted and tok == "{":
            if not words:
                raise ValueError(f"nginx.conf:{ln}: block without a name")
            block = Directive(words[0][0], [w for w, _, _ in words[1:]], words[0][1], [])
            stack[-1].children.append(block)  # type: ignore[union-attr]
            stack.append(block)
            words = []
        elif not quoted and tok == "}":
            if words or len(stack) == 1:
                raise ValueError(f"nginx.conf:{ln}: unexpected }}")
            stack.pop()
        else:
            words.append((tok, ln, quoted))
    if words or len(stack) != 1:
        raise ValueError("nginx.conf: unexpected end of file (missing ; or })")
    return root


_NGINX_TIME = re.compile(r"(\d+)(ms|s|m|h|d|w|M|y)?")
_NGINX_TIME_UNITS = {"ms": 0.001, "s": 1, None: 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "M": 2592000, "y": 31536000}


def nginx_time(value: str) -> float:
    parts = _NGINX_TIME.findall(value)
    if not parts or "".join(a + b for a, b in parts) != value:
        raise ValueError(f"not an nginx time: {value!r}")
    return sum(int(n) * _NGINX_TIME_UNITS[u or None] for n, u in parts)


def nginx_size(value: str) -> float:
    match = re.fullmatch(r"(\d+)([kKmMgG]?)", value)
    if not match:
        raise ValueError(f"not an nginx size: {value!r}")
    n = int(match.group(1)) * {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3}[match.group(2).lower()]
    return float("inf") if n == 0 else n  # 0 disables the check


def listen_port(directive: Directive) -> int:
    address = directive.args[0]
    return int(address.rsplit(":", 1)[-1]) if ":" in address.rsplit("]", 1)[-1] else int(address)


# Defaults of the directives the checks read, for a location that never sets them.
_NGINX_DEFAULTS = {
    "proxy_read_timeout": "60s", "proxy_buffering": "on", "client_max_body_size": "1m", "proxy_http_version": "1.0",
}


@dataclass
class Location:
    server: Directive
    block: Directive
    chain: list[Directive]  # http, server, location

    @property
    def label(self) -> str:
        return f"location {' '.join(self.block.args)} (nginx.conf:{self.block.line})"

    def value(self, name: str) -> str:
        for level in reversed(self.chain):
            found = level.all(name)
            if found:
                return " ".join(found[-1].args)
        return _NGINX_DEFAULTS.get(name, "")

    def headers(self) -> dict[str, str]:
        for level in reversed(self.chain):
            found = level.all("proxy_set_header")
            if found:
                return {d.args[0].lower(): " ".join(d.args[1:]) for d in found}
        return {"host": "$proxy_host", "connection": "close"}

    @property
    def proxy_pass(self) -> str | None:
        found = self.block.first("proxy_pass")
        return found.args[0] if found else None


def match_location(http: Directive, server: Directive, path: str) -> Location | None:
    """The location nginx picks for `path`: exact, then the longest prefix (^~ stops there), then
    the first matching regex, else that longest prefix. Nested locations are not supported."""
    best: Directive | None = None
    regexes = []
    for loc in server.all("location"):
        modifier, uri = (loc.args[0], loc.args[1]) if len(loc.args) == 2 else (None, loc.args[0])
        if modifier == "=":
            if path == uri:
                return Location(server, loc, [http, server, loc])
        elif modifier in ("~", "~*"):
            regexes.append((loc, re.compile(uri, re.I if modifier == "~*" else 0)))
        elif path.startswith(uri) and (best is None or len(uri) > len(best.args[-1])):
            best = loc
    if best is not None and best.args[0] == "^~":
        return Location(server, best, [http, server, best])
    for loc, regex in regexes:
        if regex.search(path):
            return Location(server, loc, [http, server, loc])
    return Location(server, best, [http, server, best]) if best is not None else None


# --------------------------------------------------------------------------------------------------
# compose.yaml: mounts and container paths.

@dataclass
class Mount:
    target: str
    source: Path | None  # host path of a bind mount
    volume: str | None  # named volume


def mounts(service: dict[str, Any], compose_dir: Path) -> list[Mount]:
    out = []
    for entry in service.get("volumes") or []:
        if isinstance(entry, dict):
            source, target, kind = str(entry.get("source", "")), str(entry["target"]), entry.get("type")
        else:
            parts = str(entry).split(":")
            source, target = (parts[0], parts[1]) if len(parts) >= 2 else ("", parts[0])
            kind = "bind" if source.startswith((".", "/", "~")) else ("volume" if source else "anonymous")
        if kind == "bind":
            out.append(Mount(target.rstrip("/") or "/", (compose_dir / source).resolve() if not source.startswith("/") else Path(source), None))
        else:
            out.append(Mount(target.rstrip("/") or "/", None, source or None))
    return out


def under(path: str, target: str) -> bool:
    return path == target or path.startswith(target.rstrip("/") + "/")


def resolve_in(service: dict[str, Any], compose_dir: Path, path: str) -> tuple[Mount | None, Path | None]:
    """The mount a container path lies in (innermost), and its host path for a bind mount."""
    best = None
    for mount in mounts(service, compose_dir):
        if under(path, mount.target) and (best is None or len(mount.target) > len(best.target)):
            best = mount
    if best is None or best.source is None:
        return best, None
    return best, best.source / os.path.relpath(path, best.target) if path != best.target else best.source


def command_words(service: dict[str, Any]) -> list[str]:
    command = service.get("command") or []
    return shlex.split(command) if isinstance(command, str) else [str(c) for c in command]


def flag_value(words: list[str], flag: str) -> str | None:
    for i, word in enumerate(words):
        if word.startswith(flag + "="):
            return word.split("=", 1)[1]
        if word == flag and i + 1 < len(words):
            return words[i + 1]
    return None


# --------------------------------------------------------------------------------------------------
# The kit: deploy/ as one set of parsed files, with problems collected rather than raised.

@dataclass
class Kit:
    deploy: Path
    problems: list[str] = field(default_factory=list)

    @cached_property
    def compose(self) -> dict[str, Any]:
        return yaml.safe_load((self.deploy / "compose.yaml").read_text(encoding="utf-8"))

    @property
    def services(self) -> dict[str, dict[str, Any]]:
        return self.compose.get("services") or {}

    @cached_property
    def final(self) -> Stage:
        return read_dockerfile(DOCKERFILE)[-1]

    @cached_property
    def gateways(self) -> list[str]:
        return gateway_service_names(self.compose)

    def by_image(self, prefix: str) -> list[str]:
        return [n for n, s in self.services.items() if str(s.get("image", "")).split(":")[0].endswith(prefix)]

    def one(self, prefix: str, what: str) -> str | None:
        found = self.by_image(prefix)
        if len(found) != 1:
            self.problems.append(f"compose.yaml: expected one {what} service (image {prefix}), found {found}")
            return None
        return found[0]

    def config_file(self, name: str) -> Path:
        """The config file a replica reads: its CMD's --config, through its mounts."""
        cmd = (self.final.last("CMD").exec_form() or []) if self.final.last("CMD") else []
        path = cmd[cmd.index("--config") + 1] if "--config" in cmd else "/etc/adk-gateway/gateway.yaml"
        _, host = resolve_in(self.services[name], self.deploy, path)
        return host if host is not None else CONFIG

    def env(self, name: str) -> dict[str, str]:
        return container_env(self.final, self.services[name])

    def config(self, name: str) -> GatewayConfig | None:
        try:
            return load_config(self.config_file(name), env=self.env(name))
        except ConfigError as exc:
            self.problems.append(f"compose.yaml: {name}'s config does not load with its environment: {exc.problems}")
            return None

    @cached_property
    def nginx(self) -> Directive | None:
        lb = self.one("nginx", "load balancer (nginx)")
        if lb is None:
            return None
        _, host = resolve_in(self.services[lb], self.deploy, "/etc/nginx/nginx.conf")
        if host is None or not host.is_file():
            self.problems.append(f"compose.yaml: {lb} does not mount an existing file at /etc/nginx/nginx.conf ({host})")
            return None
        try:
            return parse_nginx(host.read_text(encoding="utf-8"))
        except ValueError as exc:
            self.problems.append(str(exc))
            return None

    @cached_property
    def prometheus(self) -> tuple[str, dict[str, Any]] | None:
        name = self.one("prom/prometheus", "Prometheus")
        if name is None:
            return None
        path = flag_value(command_words(self.services[name]), "--config.file") or "/etc/prometheus/prometheus.yml"
        _, host = resolve_in(self.services[name], self.deploy, path)
        if host is None or not host.is_file():
            self.problems.append(f"compose.yaml: {name} reads {path}, which no bind mount provides ({host})")
            return None
        return name, yaml.safe_load(host.read_text(encoding="utf-8")) or {}

    def alert_files(self) -> list[Path]:
        return sorted(p for p in (self.deploy / "prometheus").glob("*.y*ml")
                      if isinstance(y := yaml.safe_load(p.read_text(encoding="utf-8")), dict) and "groups" in y)

    def dashboard_files(self) -> list[Path]:
        return sorted((self.deploy / "grafana").rglob("*.json"))


def _http(directive: Directive) -> Directive | None:
    return directive.first("http")


def _upstreams(http: Directive) -> dict[str, list[str]]:
    return {u.args[0]: [s.args[0] for s in u.all("server")] for u in http.all("upstream")}


def _upstream_members(http: Directive, proxy_pass: str) -> tuple[str, list[str]]:
    host = urlsplit(proxy_pass).netloc
    ups = _upstreams(http)
    return host, ups.get(host, [host])


def _servers_by_port(http: Directive) -> dict[int, Directive]:
    return {listen_port(d): s for s in http.all("server") for d in s.all("listen")}


def _route_samples(config: GatewayConfig) -> list[tuple[str, str, str]]:
    """(method, sample path, handler module) of every route of the public listener."""
    from gateway.edge.app import create_app

    out = []
    for route in create_app(config).router.routes():
        if route.method == "HEAD":
            continue
        canonical = route.resource.canonical
        path = re.sub(r"\{[^}]*\}", "chat-1", canonical)
        if type(route.resource).__name__ == "StaticResource":
            path = canonical.rstrip("/") + "/module.js"
        out.append((route.method, path, getattr(route.handler, "__module__", "")))
    return out


def _internal_paths() -> tuple[set[str], set[str]]:
    """Paths of the internal listener, and the ones the ADK plugin calls."""
    from gateway.edge.app import create_app
    from gateway.edge.internal import create_internal_app

    routes = {r.resource.canonical for r in create_internal_app(create_app(GatewayConfig())).router.routes()}
    import inspect

    from adk_gateway_plugin import GatewayPlugin

    # The plugin's own distribution (plugin/); gateway/agent_plugin.py only re-exports it.
    plugin_source = Path(inspect.getsourcefile(GatewayPlugin) or "").read_text(encoding="utf-8")
    used = set(re.findall(r"/internal/v\d+/[a-z-]+", plugin_source))
    return routes, used


# ---- the checks -----------------------------------------------------------------------------------

def check_compose_files(kit: Kit) -> list[str]:
    problems: list[str] = []
    declared = set((kit.compose.get("volumes") or {}).keys())
    for name, svc in kit.services.items():
        for mount in mounts(svc, kit.deploy):
            if mount.source is not None:
                if not mount.source.exists():
                    problems.append(f"compose.yaml: {name} mounts {mount.source}, which does not exist")
                elif Path(mount.target).suffix and not mount.source.is_file():
                    problems.append(f"compose.yaml: {name} mounts the folder {mount.source} at the file path {mount.target}")
            elif mount.volume and mount.volume not in declared:
                problems.append(f"compose.yaml: {name} uses volume {mount.volume!r}, not declared under top-level volumes")
        # Container paths the service is told to read must be there when they lie in a bind mount.
        values = [*command_words(svc), *(v for v in service_env(svc).values() if v)]
        for value in values:
            path = value.split("=", 1)[1] if value.startswith("-") and "=" in value else value
            if not path.startswith("/"):
                continue
            mount, host = resolve_in(svc, kit.deploy, path)
            if host is not None and not host.exists():
                problems.append(f"compose.yaml: {name} is told to read {path}, but its mount of {mount.source} has no {host.name}")  # type: ignore[union-attr]
        depends = svc.get("depends_on") or {}
        for dep, cond in (depends.items() if isinstance(depends, dict) else ((d, {}) for d in depends)):
            if dep not in kit.services:
                problems.append(f"compose.yaml: {name} depends on {dep!r}, which is not a service")
            elif (cond or {}).get("condition") == "service_healthy":
                has_check = kit.services[dep].get("healthcheck") or (dep in kit.gateways and kit.final.last("HEALTHCHECK"))
                if not has_check:
                    problems.append(f"compose.yaml: {name} waits for {dep} to be healthy, but {dep} has no healthcheck")
    for name in kit.gateways:
        config = kit.config_file(name)
        if config.resolve() != CONFIG.resolve():
            problems.append(f"compose.yaml: {name} reads {config}, but the tests validate {CONFIG} with the compose env")
    readme = (kit.deploy / "README.md").read_text(encoding="utf-8") if (kit.deploy / "README.md").is_file() else ""
    for var in sorted(set(re.findall(r"\$\{([A-Za-z_][A-Za-z0-9_]*):\?", (kit.deploy / "compose.yaml").read_text()))):
        if var not in readme:
            problems.append(f"compose.yaml requires {var} from the shell, but deploy/README.md does not mention it")
    return problems


def check_replicas(kit: Kit) -> list[str]:
    problems: list[str] = []
    if not kit.gateways:
        return ["compose.yaml: no gateway replica (a service built from deploy/Dockerfile running its CMD)"]
    # One replica until the Redis backend exists (check_redis refuses several without it).
    first = kit.services[kit.gateways[0]]
    for name in kit.gateways[1:]:
        differ = sorted(k for k in set(first) | set(kit.services[name]) if first.get(k) != kit.services[name].get(k))
        if differ:
            problems.append(f"compose.yaml: replicas {kit.gateways[0]} and {name} differ in {differ}")
    refs = config_references(CONFIG)
    for name in kit.gateways:
        for var in service_env(kit.services[name]):
            if var not in refs and not pending_config_var(var, refs):
                problems.append(f"compose.yaml: {name} is given {var}, but config/gateway.yaml never reads ${{{var}}}")
        config = kit.config(name)
        if config is not None and config.internal.host in LOOPBACK:
            problems.append(f"compose.yaml: {name}'s internal listener binds {config.internal.host}, unreachable from the balancer")
    return problems


def check_load_balancer(kit: Kit) -> list[str]:
    problems: list[str] = []
    root = kit.nginx
    lb = kit.one("nginx", "load balancer (nginx)")
    if root is None or lb is None or not kit.gateways:
        return []  # the Kit recorded why
    http = _http(root)
    if http is None:
        return ["nginx.conf: no http block"]
    config = kit.config(kit.gateways[0])
    if config is None:
        return []
    public_members = sorted(f"{g}:{config.listen.port}" for g in kit.gateways)
    internal_members = sorted(f"{g}:{config.internal.port}" for g in kit.gateways)
    services = set(kit.services)
    for upstream, members in _upstreams(http).items():
        for member in members:
            host = member.rsplit(":", 1)[0]
            if host not in services:
                problems.append(f"nginx.conf: upstream {upstream} has server {member}, but {host!r} is not a compose service")

    servers = _servers_by_port(http)
    published = published_container_ports(kit.services[lb])
    agent_url = urlsplit(service_env(kit.services.get("agent", {})).get("ADK_GATEWAY_URL") or "")
    internal_port = agent_url.port
    if set(published) & {internal_port}:
        problems.append(f"compose.yaml: {lb} publishes the internal (plugin) port {internal_port} to the host")
    public_ports = [p for p in published if p in servers]
    for port in published:
        if port not in servers:
            problems.append(f"compose.yaml: {lb} publishes container port {port}, but no nginx server listens on it ({sorted(servers)})")
    if len(public_ports) != 1:
        problems.append(f"compose.yaml: {lb} should publish exactly one nginx server port for browsers, publishes {published}")
        return problems

    # Browsers: every route of the public listener, matched as nginx matches it.
    public = servers[public_ports[0]]
    for method, path, module in _route_samples(config):
        loc = match_location(http, public, path)
        what = f"{method} {path}"
        if path == config.metrics.path:
            if loc is not None and loc.proxy_pass:
                problems.append(f"nginx.conf: {what} is forwarded to the gateways by {loc.label}; keep the metrics private (return 404)")
            continue
        if loc is None or not loc.proxy_pass:
            problems.append(f"nginx.conf: {what} (a gateway route) reaches no proxy_pass on port {public_ports[0]}")
            continue
        upstream, members = _upstream_members(http, loc.proxy_pass)
        if sorted(members) != public_members:
            problems.append(f"nginx.conf: {what} goes to {upstream} = {sorted(members)}, expected every replica's public port {public_members}")
        headers = loc.headers()
        if headers.get("host") != "$http_host":
            problems.append(f"nginx.conf: {loc.label} sends Host {headers.get('host')!r}; the gateway's same-origin check needs $http_host (host and port)")
        if method == "POST" and nginx_size(loc.value("client_max_body_size")) < config.chat.max_body_bytes:
            problems.append(f"nginx.conf: {loc.label} has client_max_body_size {loc.value('client_max_body_size')}, below chat.max_body_bytes ({config.chat.max_body_bytes} bytes)")
        read = nginx_time(loc.value("proxy_read_timeout"))
        if module.endswith(".sse") and method != "OPTIONS":
            if loc.value("proxy_buffering") != "off":
                problems.append(f"nginx.conf: {what} is an SSE stream but {loc.label} has proxy_buffering {loc.value('proxy_buffering')}")
            if read <= config.chat.keepalive_interval:
                problems.append(f"nginx.conf: {loc.label} proxy_read_timeout {read:g}s does not outlast chat.keepalive_interval ({config.chat.keepalive_interval:g}s)")
        if module.endswith(".ws") and method == "GET":  # the handshake; POST .../ws-ticket is plain HTTP
            maps = {d.args[1]: d for d in http.all("map") if len(d.args) == 2 and d.args[0] == "$http_upgrade"}
            if headers.get("upgrade") != "$http_upgrade":
                problems.append(f"nginx.conf: {what} is the WebSocket route but {loc.label} does not pass Upgrade $http_upgrade")
            connection = headers.get("connection", "")
            if connection.lower() != "upgrade" and connection not in maps:
                problems.append(f"nginx.conf: {what} is the WebSocket route but {loc.label} sends Connection {connection!r} (upgrade, or a map of $http_upgrade)")
            if loc.value("proxy_http_version") != "1.1":
                problems.append(f"nginx.conf: {loc.label} speaks HTTP/{loc.value('proxy_http_version')} upstream; WebSocket upgrades need proxy_http_version 1.1")
            if read <= config.websocket.heartbeat:
                problems.append(f"nginx.conf: {loc.label} proxy_read_timeout {read:g}s does not outlast websocket.heartbeat ({config.websocket.heartbeat:g}s)")

    # The agent's plugin: the balancer's internal port, to every replica's internal listener.
    if agent_url.hostname != lb:
        problems.append(f"compose.yaml: the agent's ADK_GATEWAY_URL host is {agent_url.hostname!r}, not the balancer {lb!r} (gated calls may belong to any replica)")
    if internal_port not in servers:
        problems.append(f"compose.yaml: the agent's ADK_GATEWAY_URL uses port {internal_port}, but nginx listens on {sorted(servers)}")
        return problems
    internal = servers[internal_port]
    routes, used = _internal_paths()
    gated = [p.timeout for agent in config.agents.values() for p in agent.tools.values() if p.gated]
    for path in sorted(routes):
        loc = match_location(http, internal, path)
        if path not in used:
            if loc is not None and loc.proxy_pass:
                problems.append(f"nginx.conf: {path} (not a plugin route) is forwarded by {loc.label} to one replica; answer it on the balancer and call each replica")
            continue
        if loc is None or not loc.proxy_pass:
            problems.append(f"nginx.conf: the plugin's {path} reaches no proxy_pass on port {internal_port}")
            continue
        upstream, members = _upstream_members(http, loc.proxy_pass)
        if sorted(members) != internal_members:
            problems.append(f"nginx.conf: the plugin's {path} goes to {upstream} = {sorted(members)}, expected every replica's internal port {internal_members}")
        read = nginx_time(loc.value("proxy_read_timeout"))
        if gated and read < max(gated):
            problems.append(f"nginx.conf: {loc.label} proxy_read_timeout {read:g}s is shorter than the longest tool timeout ({max(gated):g}s): decisions would end in 504")
    return problems


def check_prometheus(kit: Kit) -> list[str]:
    loaded = kit.prometheus
    if loaded is None or not kit.gateways:
        return []  # the Kit recorded why
    name, prom = loaded
    config = kit.config(kit.gateways[0])
    if config is None:
        return []
    problems: list[str] = []
    if not config.metrics.enabled:
        problems.append("config/gateway.yaml: metrics.enabled is false, so Prometheus has nothing to scrape")
    expected = sorted(f"{g}:{config.listen.port}" for g in kit.gateways)
    jobs = []
    for job in prom.get("scrape_configs") or []:
        targets = [t for sc in job.get("static_configs") or [] for t in sc.get("targets") or []]
        for target in targets:
            if target.rsplit(":", 1)[0] not in kit.services:
                problems.append(f"prometheus.yml: job {job.get('job_name')} scrapes {target}, which is not a compose service")
        if any(t.rsplit(":", 1)[0] in kit.gateways for t in targets) or job.get("job_name") == "adk-gateway":
            jobs.append((job, sorted(targets)))
    if len(jobs) != 1:
        return problems + [f"prometheus.yml: expected one scrape job for the gateway replicas, found {[j.get('job_name') for j, _ in jobs]}"]
    job, targets = jobs[0]
    if targets != expected:
        problems.append(f"prometheus.yml: job {job.get('job_name')} scrapes {targets}, expected every replica's listen port {expected}")
    if job.get("metrics_path", "/metrics") != config.metrics.path:
        problems.append(f"prometheus.yml: job {job.get('job_name')} metrics_path {job.get('metrics_path')} is not metrics.path {config.metrics.path}")
    if job.get("scheme", "http") != "http":
        problems.append(f"prometheus.yml: job {job.get('job_name')} uses scheme {job.get('scheme')}; the gateway serves plain HTTP")
    rule_files = prom.get("rule_files") or []
    if not rule_files:
        problems.append("prometheus.yml: no rule_files, so the alert rules are never loaded")
    for pattern in rule_files:
        mount, host = resolve_in(kit.services[name], kit.deploy, pattern)
        if host is None or not (list(host.parent.glob(host.name)) if any(c in host.name for c in "*?[") else host.is_file()):
            problems.append(f"prometheus.yml: rule file {pattern} is not provided by a bind mount of {name}")
    return problems


def scrape_interval(kit: Kit) -> float:
    loaded = kit.prometheus
    prom = loaded[1] if loaded else {}
    interval = (prom.get("global") or {}).get("scrape_interval", "1m")
    for job in prom.get("scrape_configs") or []:
        if job.get("job_name") == "adk-gateway" and job.get("scrape_interval"):
            interval = job["scrape_interval"]
    return prom_duration(interval)


def job_names(kit: Kit) -> set[str]:
    loaded = kit.prometheus
    return {j.get("job_name") for j in (loaded[1].get("scrape_configs") or [])} if loaded else set()


def check_grafana(kit: Kit) -> list[str]:
    name = kit.one("grafana/grafana", "Grafana")
    loaded = kit.prometheus
    if name is None or loaded is None:
        return []  # the Kit recorded why
    prom_name, _ = loaded
    prom_port = int((flag_value(command_words(kit.services[prom_name]), "--web.listen-address") or ":9090").rsplit(":", 1)[1])
    svc = kit.services[name]
    provisioning = service_env(svc).get("GF_PATHS_PROVISIONING") or "/etc/grafana/provisioning"
    _, host = resolve_in(svc, kit.deploy, provisioning)
    if host is None or not host.is_dir():
        return [f"compose.yaml: {name} has no provisioning folder mounted at {provisioning}"]
    problems: list[str] = []
    uids = set()
    sources = [d for f in sorted((host / "datasources").glob("*.y*ml")) for d in (yaml.safe_load(f.read_text()) or {}).get("datasources") or []]
    for source in sources:
        if source.get("type") != "prometheus":
            continue
        uids.add(source.get("uid"))
        url = urlsplit(source.get("url", ""))
        if url.hostname != prom_name or (url.port or 80) != prom_port:
            problems.append(f"grafana datasource {source.get('name')}: url {source.get('url')} is not the {prom_name} service on port {prom_port}")
    if not uids:
        problems.append(f"grafana: no Prometheus datasource under {host / 'datasources'}")
    providers = [p for f in sorted((host / "dashboards").glob("*.y*ml")) for p in (yaml.safe_load(f.read_text()) or {}).get("providers") or []]
    provided: list[Path] = []
    for provider in providers:
        path = (provider.get("options") or {}).get("path", "")
        _, dash_dir = resolve_in(svc, kit.deploy, path)
        if dash_dir is None or not dash_dir.is_dir() or not list(dash_dir.glob("*.json")):
            problems.append(f"grafana dashboard provider {provider.get('name')}: {path} is not a mounted folder with dashboards")
        else:
            provided += sorted(dash_dir.glob("*.json"))
    if not providers:
        problems.append(f"grafana: no dashboard provider under {host / 'dashboards'}")
    for path in kit.dashboard_files():
        if provided and path.resolve() not in {p.resolve() for p in provided}:
            problems.append(f"grafana: dashboard {path.name} is not in a folder a provider loads")
        for where, datasource in _datasources(json.loads(path.read_text(encoding="utf-8"))):
            uid = datasource.get("uid") if isinstance(datasource, dict) else datasource
            if uid is not None and uid not in uids:
                problems.append(f"{path.name}: {where} uses datasource {uid!r}, not a provisioned uid {sorted(uids)}")
    return problems


def _datasources(dashboard: dict[str, Any]) -> Iterator[tuple[str, Any]]:
    for panel in _panels(dashboard):
        if panel.get("datasource") is not None:
            yield f"panel {panel.get('title')!r}", panel["datasource"]
        for target in panel.get("targets") or []:
            if target.get("datasource") is not None:
                yield f"panel {panel.get('title')!r} target {target.get('refId')}", target["datasource"]
    for var in (dashboard.get("templating") or {}).get("list") or []:
        if var.get("datasource") is not None:
            yield f"variable {var.get('name')}", var["datasource"]


def _panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in dashboard.get("panels") or []:
        yield panel
        yield from panel.get("panels") or []


def check_redis(kit: Kit) -> list[str]:
    problems: list[str] = []
    backends = {service_env(kit.services[g]).get("SESSIONS_BACKEND") for g in kit.gateways}
    if len(kit.gateways) > 1 and backends != {"redis"}:
        problems.append(f"compose.yaml: {len(kit.gateways)} replicas must share chats, but SESSIONS_BACKEND is {sorted(map(str, backends))}, not redis")
    if "redis" not in backends:
        return problems
    name = kit.one("redis", "Redis")
    if name is None:
        return problems
    redis = kit.services[name]
    port = int(flag_value(command_words(redis), "--port") or 6379)
    if not redis.get("healthcheck"):
        problems.append(f"compose.yaml: {name} has no healthcheck, so the replicas cannot wait for it")
    for gateway in kit.gateways:
        env = service_env(kit.services[gateway])
        url = urlsplit(env.get("REDIS_URL") or "")
        if url.scheme not in ("redis", "rediss") or url.hostname != name or (url.port or 6379) != port:
            problems.append(f"compose.yaml: {gateway}'s REDIS_URL {env.get('REDIS_URL')!r} is not redis://{name}:{port}/...")
        depends = kit.services[gateway].get("depends_on") or {}
        if not isinstance(depends, dict) or (depends.get(name) or {}).get("condition") != "service_healthy":
            problems.append(f"compose.yaml: {gateway} does not wait for {name} (depends_on with condition: service_healthy)")
        if "sessions" in GatewayConfig.model_fields:
            config = kit.config(gateway)
            sessions = getattr(config, "sessions", None)
            if config is not None and getattr(sessions, "backend", None) != "redis":
                problems.append(f"config/gateway.yaml: with {gateway}'s environment sessions.backend is {getattr(sessions, 'backend', None)!r}, not redis")
            url_value = getattr(sessions, "redis_url", None)
            url_value = url_value.get_secret_value() if hasattr(url_value, "get_secret_value") else url_value  # type: ignore[union-attr]
            if config is not None and str(url_value).rstrip("/") != str(env.get("REDIS_URL")).rstrip("/"):
                problems.append(f"config/gateway.yaml: with {gateway}'s environment sessions.redis_url is not its REDIS_URL {env.get('REDIS_URL')!r}")
    return problems


# ---- PromQL in the dashboard and the alerts -------------------------------------------------------

@dataclass
class Query:
    where: str
    expr: str
    legend_labels: set[str]
    is_alert: bool = False
    parsed: PromQL | None = None


def queries(kit: Kit) -> tuple[list[Query], list[str]]:
    """Every PromQL expression of the dashboards and the alert rules, parsed."""
    found: list[Query] = []
    problems: list[str] = []
    for path in kit.dashboard_files():
        dashboard = json.loads(path.read_text(encoding="utf-8"))
        for panel in _panels(dashboard):
            for target in panel.get("targets") or []:
                if target.get("expr"):
                    legend = set(re.findall(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}", target.get("legendFormat") or ""))
                    found.append(Query(f"{path.name}: panel {panel.get('title')!r} {target.get('refId')}", target["expr"], legend))
        for var in (dashboard.get("templating") or {}).get("list") or []:
            query = var.get("query")
            query = query.get("query") if isinstance(query, dict) else query
            match = re.fullmatch(r"\s*label_values\((.*),\s*([A-Za-z_][A-Za-z0-9_]*)\s*\)\s*", query or "", re.S)
            if match:
                found.append(Query(f"{path.name}: variable {var.get('name')}", match.group(1), {match.group(2)}))
    for path in kit.alert_files():
        for group in (yaml.safe_load(path.read_text(encoding="utf-8")) or {}).get("groups") or []:
            for rule in group.get("rules") or []:
                texts = " ".join(str(v) for v in (rule.get("annotations") or {}).values())
                labels = set(re.findall(r"\$labels\.([A-Za-z_][A-Za-z0-9_]*)", texts))
                found.append(Query(f"{path.name}: {rule.get('alert') or rule.get('record')}", str(rule.get("expr", "")), labels, True))
    for query in found:
        try:
            query.parsed = parse_promql(query.expr)
        except ValueError as exc:
            problems.append(f"{query.where}: cannot parse {query.expr!r}: {exc}")
    return found, problems


def check_metric_names(kit: Kit, exported: dict[str, set[str]]) -> list[str]:
    found, problems = queries(kit)
    jobs = job_names(kit)
    interval = scrape_interval(kit)
    for query in found:
        q = query.parsed
        if q is None:
            continue
        if not q.metrics:
            problems.append(f"{query.where}: {query.expr!r} names no metric")
        allowed_all = set(TARGET_LABELS) | {"__name__"}
        for selector in q.selectors:
            name = selector.metric
            if name is None:
                problems.append(f"{query.where}: a selector without a metric name: {query.expr!r}")
                continue
            if name not in exported and name not in PROMETHEUS_SERIES:
                problems.append(f"{query.where}: {name} is not a metric the gateway exports (nor Prometheus's own up)")
                continue
            allowed = set(TARGET_LABELS) | {"__name__"} | exported.get(name, set())
            allowed_all |= allowed
            for label, op, value in selector.matchers:
                if label not in allowed:
                    problems.append(f"{query.where}: {name} has no label {label!r} (it has {sorted(allowed - {'__name__'})})")
                if label == "job" and op == "=" and value not in jobs:
                    problems.append(f"{query.where}: job={value!r} is not a scrape job of prometheus.yml ({sorted(jobs)})")
                if label == "job" and op == "=~" and not any(re.fullmatch(value, j) for j in jobs):
                    problems.append(f"{query.where}: job=~{value!r} matches no scrape job of prometheus.yml ({sorted(jobs)})")
        for label in sorted(q.grouping - allowed_all):
            problems.append(f"{query.where}: groups by {label!r}, a label none of {sorted(q.metrics)} has")
        for label in sorted(query.legend_labels - (q.grouping or allowed_all)):
            problems.append(f"{query.where}: shows label {label!r}, which its result does not carry (grouped by {sorted(q.grouping)})")
        for fn in sorted(q.functions - PROMQL_FUNCTIONS - PROMQL_AGGREGATIONS):
            problems.append(f"{query.where}: {fn}() is not a PromQL function")
        if query.is_alert:
            for window in q.ranges:
                seconds = prom_duration(window.split(":")[0])
                if seconds < 4 * interval:
                    problems.append(f"{query.where}: range [{window}] is shorter than 4 scrape intervals ({4 * interval:g}s): rate() gets too few samples")
    return problems


# What issue 7 asks of the dashboard and the alerts, as properties of their parsed PromQL.
def _quantile(expr: str) -> float | None:
    match = re.search(r"histogram_quantile\s*\(\s*([0-9.]+)", expr)
    return float(match.group(1)) if match else None


REQUIRED_PANELS: dict[str, Callable[[list[Query]], bool]] = {
    "approval wait p50/p95 by tool": lambda qs: {0.5, 0.95} <= {
        _quantile(q.expr) for q in qs if "adk_gateway_approval_wait_seconds_bucket" in q.parsed.metrics and "tool" in q.parsed.grouping  # type: ignore[union-attr]
    },
    "approval timeouts": lambda qs: any("adk_gateway_approval_timeouts_total" in q.parsed.metrics for q in qs),  # type: ignore[union-attr]
    "pending approvals": lambda qs: any("adk_gateway_approvals_pending" in q.parsed.metrics for q in qs),  # type: ignore[union-attr]
    "sessions by transport": lambda qs: any(
        "adk_gateway_active_streams" in q.parsed.metrics and "transport" in q.parsed.grouping for q in qs  # type: ignore[union-attr]
    ),
    "upstream errors": lambda qs: any("adk_gateway_upstream_errors_total" in q.parsed.metrics for q in qs),  # type: ignore[union-attr]
    "time to first event": lambda qs: any(
        "adk_gateway_upstream_first_event_seconds_bucket" in q.parsed.metrics and _quantile(q.expr) for q in qs  # type: ignore[union-attr]
    ),
    "reloads": lambda qs: any("adk_gateway_config_reloads_total" in q.parsed.metrics for q in qs),  # type: ignore[union-attr]
}

REQUIRED_ALERTS: dict[str, Callable[[PromQL], bool]] = {
    "approval timeouts ratio": lambda q: {"adk_gateway_approval_timeouts_total", "adk_gateway_approval_wait_seconds_count"} <= q.metrics
    and "/" in q.expr,
    "upstream error rate": lambda q: "adk_gateway_upstream_errors_total" in q.metrics and bool({"rate", "irate", "increase"} & q.functions),
    "replica down (up)": lambda q: "up" in q.metrics,
    "replica not ready: upstream unreachable": lambda q: "adk_gateway_upstream_up" in q.metrics,
    "replica not ready: draining": lambda q: "adk_gateway_draining" in q.metrics,
}


def check_dashboard_and_alerts(kit: Kit) -> list[str]:
    found, problems = queries(kit)
    panels = [q for q in found if not q.is_alert and q.parsed is not None and "panel" in q.where]
    by_panel: dict[str, list[Query]] = {}
    for q in panels:
        by_panel.setdefault(q.where.rsplit(" ", 1)[0], []).append(q)
    for need, ok in REQUIRED_PANELS.items():
        if not any(ok(qs) for qs in by_panel.values()):
            problems.append(f"dashboard: no panel shows {need} (issue 7)")
    alerts = [q for q in found if q.is_alert and q.parsed is not None]
    for need, ok in REQUIRED_ALERTS.items():
        if not any(ok(q.parsed) for q in alerts):  # type: ignore[arg-type]
            problems.append(f"alerts: no rule watches {need} (issue 7)")
    names: set[str] = set()
    for path in kit.alert_files():
        for group in (yaml.safe_load(path.read_text(encoding="utf-8")) or {}).get("groups") or []:
            for rule in group.get("rules") or []:
                alert = rule.get("alert")
                where = f"{path.name}: {alert or rule.get('record')}"
                if not alert:
                    continue
                if alert in names:
                    problems.append(f"{where}: alert name used twice")
                names.add(alert)
                if (rule.get("labels") or {}).get("severity") not in ("critical", "warning", "info"):
                    problems.append(f"{where}: labels.severity should be critical, warning or info")
                if not (rule.get("annotations") or {}).get("summary"):
                    problems.append(f"{where}: no annotations.summary")
                if "for" in rule:
                    try:
                        prom_duration(rule["for"])
                    except ValueError as exc:
                        problems.append(f"{where}: for: {exc}")
    return problems


ALL_CHECKS: list[Callable[[Kit], list[str]]] = [
    check_compose_files, check_replicas, check_load_balancer, check_prometheus, check_grafana, check_redis,
    check_dashboard_and_alerts,
]


def run(check: Callable[..., list[str]], kit: Kit, *args: Any) -> list[str]:
    """A check's problems, plus what the Kit met while loading the files for it."""
    problems = check(kit, *args)
    return problems + [p for p in dict.fromkeys(kit.problems) if p not in problems]


def all_problems(deploy: Path, exported: dict[str, set[str]]) -> list[str]:
    problems: list[str] = []
    for check in ALL_CHECKS:
        problems += run(check, Kit(deploy))
    return problems + run(check_metric_names, Kit(deploy), exported)


# --------------------------------------------------------------------------------------------------
# fixtures

@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, set[str]]:
    """What a real gateway exports: scraped from a gateway process (its upstream need not answer)."""
    tmp = tmp_path_factory.mktemp("ops-kit-scrape")
    dead = f"http://127.0.0.1:{free_port()}"
    with gateway_process(tmp, dead) as gw:
        with urllib.request.urlopen(f"{gw.base}/metrics", timeout=10) as resp:
            text = resp.read().decode()
    series = exported_series(text)
    assert any(n.startswith("adk_gateway_") for n in series), f"the gateway's /metrics exports no adk_gateway_ metric:\n{text[:500]}"
    for name, labels in declared_labels().items():
        assert name in series, f"gateway/ops/metrics.py declares {name}, but a scrape of a running gateway does not show it"
        series[name] |= labels
    return series


@pytest.fixture
def kit() -> Kit:
    return Kit(DEPLOY)


def _assert_none(problems: list[str]) -> None:
    assert not problems, "\n".join(problems)


# --------------------------------------------------------------------------------------------------
# the checks on deploy/

def test_promql_parser_reads_what_the_kit_writes() -> None:
    q = parse_promql(
        'histogram_quantile(0.95, sum by (tool, le) (rate(adk_gateway_approval_wait_seconds_bucket{job="adk-gateway", '
        'instance=~"$instance"}[$__rate_interval]))) / on (tool) group_left sum without (x) (up) > bool 0.5 offset 5m'
    )
    assert q.metrics == {"adk_gateway_approval_wait_seconds_bucket", "up"}
    assert q.grouping == {"tool", "le", "x"}
    assert q.functions == {"histogram_quantile", "sum", "rate"}
    assert q.selectors[0].matchers == [("job", "=", "adk-gateway"), ("instance", "=~", "$instance")]
    assert q.ranges == ["$__rate_interval"]
    assert parse_promql('{__name__="up"}').metrics == {"up"}
    assert parse_promql("sum(x) by (kind)").grouping == {"kind"}
    with pytest.raises(ValueError):
        parse_promql("sum(rate(x[5m])")


def test_nginx_parser_matches_locations_like_nginx() -> None:
    root = parse_nginx(
        "http { upstream u { server a:1; } server { listen 8080; proxy_set_header Host $host;"
        " location / { proxy_pass http://u; } location = /x { return 404; }"
        " location ^~ /static/ { proxy_set_header X 1; } location ~ \\.js$ { } } }"
    )
    http = root.first("http")
    server = http.first("server")  # type: ignore[union-attr]
    assert match_location(http, server, "/x").block.args == ["=", "/x"]  # type: ignore[union-attr,arg-type]
    assert match_location(http, server, "/x/y").block.args == ["/"]  # type: ignore[union-attr,arg-type]
    assert match_location(http, server, "/static/a.js").block.args == ["^~", "/static/"]  # type: ignore[union-attr,arg-type]
    assert match_location(http, server, "/a.js").block.args == ["~", "\\.js$"]  # type: ignore[union-attr,arg-type]
    # proxy_set_header: a level that sets any replaces all of the enclosing level's.
    assert match_location(http, server, "/").headers() == {"host": "$host"}  # type: ignore[union-attr,arg-type]
    assert match_location(http, server, "/static/a").headers() == {"x": "1"}  # type: ignore[union-attr,arg-type]
    assert nginx_time("1h30m") == 5400 and nginx_time("65m") == 3900 and nginx_size("4m") == 4 * 1024**2


def test_compose_files_mounts_and_dependencies(kit: Kit) -> None:
    _assert_none(run(check_compose_files, kit))


def test_gateway_replicas_are_identical_and_read_their_environment(kit: Kit) -> None:
    _assert_none(run(check_replicas, kit))


def test_load_balancer_routes_browsers_and_the_plugin_to_every_replica(kit: Kit) -> None:
    _assert_none(run(check_load_balancer, kit))


def test_prometheus_scrapes_every_replica_and_loads_the_alerts(kit: Kit) -> None:
    _assert_none(run(check_prometheus, kit))


def test_grafana_datasource_and_dashboards_are_provisioned(kit: Kit) -> None:
    _assert_none(run(check_grafana, kit))


def test_replicas_share_chats_through_redis(kit: Kit) -> None:
    _assert_none(run(check_redis, kit))


def test_dashboard_and_alerts_cover_issue_7(kit: Kit) -> None:
    _assert_none(run(check_dashboard_and_alerts, kit))


def test_every_metric_in_the_dashboard_and_alerts_is_exported(kit: Kit, exported: dict[str, set[str]]) -> None:
    found, _ = queries(kit)
    assert len([q for q in found if q.is_alert]) >= len(REQUIRED_ALERTS) and len(found) > 20, "too few queries found"
    _assert_none(run(check_metric_names, kit, exported))


# ---- each check can fail --------------------------------------------------------------------------

# (id, file under deploy/, text to replace, replacement, fragment the problems must contain)
BREAKAGES = [
    ("upstream-misses-replica", "nginx/nginx.conf", "server gateway-1:8080 max_fails=3 fail_timeout=10s;", "", "gateway-1:8080"),
    ("upstream-wrong-port", "nginx/nginx.conf", "server gateway-1:8081;", "server gateway-1:8082;", "gateway-1:8082"),
    ("upstream-unknown-host", "nginx/nginx.conf", "server gateway-1:8080 max", "server gateway-9:8080 max", "'gateway-9' is not a compose service"),
    ("sse-buffered", "nginx/nginx.conf", "proxy_buffering off;", "", "proxy_buffering on"),
    ("ws-no-upgrade", "nginx/nginx.conf", "proxy_set_header Upgrade $http_upgrade;", "", "Upgrade $http_upgrade"),
    ("ws-host-without-port", "nginx/nginx.conf", "proxy_set_header Host $http_host;\n            # The gateway adopts",
     "proxy_set_header Host $host;\n            # The gateway adopts", "Host '$host'"),
    ("body-too-small", "nginx/nginx.conf", "client_max_body_size 4m;", "client_max_body_size 1m;", "client_max_body_size 1m"),
    ("internal-timeout-short", "nginx/nginx.conf", "proxy_read_timeout 65m;", "proxy_read_timeout 2m;", "longest tool timeout"),
    ("sse-timeout-short", "nginx/nginx.conf", "proxy_read_timeout 1h;\n            proxy_send_timeout 1h;\n        }\n    }",
     "proxy_read_timeout 10s;\n            proxy_send_timeout 1h;\n        }\n    }", "chat.keepalive_interval"),
    ("metrics-public", "nginx/nginx.conf", "location = /metrics {\n            return 404;\n        }", "", "keep the metrics private"),
    ("reload-through-lb", "nginx/nginx.conf", "location = /internal/v1/reload {", "location = /internal/v1/reload-x {", "/internal/v1/reload (not a plugin route)"),
    ("internal-port-moved", "nginx/nginx.conf", "listen 8081;", "listen 9081;", "ADK_GATEWAY_URL uses port 8081"),
    ("nginx-syntax", "nginx/nginx.conf", "keepalive 64;", "keepalive 64", "nginx.conf"),
    ("lb-publishes-other-port", "compose.yaml", '"127.0.0.1:8080:8080"', '"127.0.0.1:8080:9999"', "publishes container port 9999"),
    ("lb-publishes-internal", "compose.yaml", '      - "127.0.0.1:8080:8080"\n',
     '      - "127.0.0.1:8080:8080"\n      - "127.0.0.1:8081:8081"\n', "publishes the internal (plugin) port"),
    ("mount-missing", "compose.yaml", "./nginx/nginx.conf:/etc", "./nginx/missing.conf:/etc", "missing.conf"),
    ("config-mount-elsewhere", "compose.yaml", "../config:/etc/adk-gateway:ro", "./nginx:/etc/adk-gateway:ro", "the tests validate"),
    ("agent-to-one-replica", "compose.yaml", "ADK_GATEWAY_URL: http://lb:8081", "ADK_GATEWAY_URL: http://gateway-1:8081", "not the balancer 'lb'"),
    ("replicas-without-redis", "compose.yaml", "SESSIONS_BACKEND: redis", "SESSIONS_BACKEND: memory", "must share chats"),
    ("redis-url-elsewhere", "compose.yaml", "REDIS_URL: redis://redis:6379/0", "REDIS_URL: redis://cache:6379/0", "is not redis://redis:6379"),
    ("replica-not-balanced", "compose.yaml", "  gateway-2: *gateway\n", "  gateway-2: *gateway\n  gateway-3: *gateway\n", "gateway-3"),
    ("env-typo", "compose.yaml", "LOG_LEVEL: info", "LOG_LEVL: info", "LOG_LEVL"),
    ("unknown-dependency", "compose.yaml", "depends_on:\n      - prometheus", "depends_on:\n      - prometheus-x", "'prometheus-x', which is not a service"),
    ("undocumented-shell-var", "README.md", "GRAFANA_ADMIN_PASSWORD", "GRAFANA_PASSWORD", "GRAFANA_ADMIN_PASSWORD"),
    ("grafana-provisioning-unmounted", "compose.yaml", "./grafana/provisioning:/etc/grafana/provisioning:ro",
     "./grafana/provisioning:/etc/grafana/provisioning-x:ro", "no provisioning folder"),
    ("grafana-home-missing", "compose.yaml", "/etc/grafana/dashboards/adk-gateway.json", "/etc/grafana/dashboards/home.json", "home.json"),
    ("scrape-wrong-port", "prometheus/prometheus.yml", "- gateway-1:8080", "- gateway-1:9090", "gateway-1:9090"),
    ("scrape-wrong-path", "prometheus/prometheus.yml", "metrics_path: /metrics", "metrics_path: /stats", "metrics_path /stats"),
    ("rules-unmounted", "prometheus/prometheus.yml", "- /etc/prometheus/alerts.yml", "- /etc/prometheus/rules.yml", "rules.yml"),
    ("job-renamed", "prometheus/prometheus.yml", "job_name: adk-gateway", "job_name: gateways", "job='adk-gateway' is not a scrape job"),
    ("alert-metric-typo", "prometheus/alerts.yml", "adk_gateway_upstream_errors_total", "adk_gateway_upstream_error_total", "adk_gateway_upstream_error_total is not a metric"),
    ("alert-label-typo", "prometheus/alerts.yml", "sum by (instance, tool)", "sum by (instance, tools)", "groups by 'tools'"),
    ("alert-annotation-label", "prometheus/alerts.yml", "Gated tool {{ $labels.tool }}", "Gated tool {{ $labels.tool_name }}", "'tool_name'"),
    ("alert-range-short", "prometheus/alerts.yml", "kind!=\"session_missing\"}[5m]", "kind!=\"session_missing\"}[30s]", "range [30s]"),
    ("alert-function-typo", "prometheus/alerts.yml", "absent(up", "absnet(up", "absnet() is not a PromQL function"),
    ("alert-missing-draining", "prometheus/alerts.yml", 'adk_gateway_draining{job="adk-gateway"} == 1', 'adk_gateway_upstream_up{job="adk-gateway"} == 1',
     "replica not ready: draining"),
    ("alert-no-severity", "prometheus/alerts.yml", "severity: critical\n        annotations:\n          summary: \"No gateway",
     "level: critical\n        annotations:\n          summary: \"No gateway", "labels.severity"),
    ("panel-histogram-name", "grafana/dashboards/adk-gateway.json", "adk_gateway_upstream_first_event_seconds_bucket",
     "adk_gateway_upstream_first_event_seconds", "adk_gateway_upstream_first_event_seconds is not a metric"),
    ("panel-wrong-grouping", "grafana/dashboards/adk-gateway.json", "sum by (transport)", "sum by (kind)", "groups by 'kind'"),
    ("panel-legend-label", "grafana/dashboards/adk-gateway.json", '"legendFormat": "{{kind}}"', '"legendFormat": "{{reason}}"', "shows label 'reason'"),
    ("panel-matcher-label", "grafana/dashboards/adk-gateway.json", 'route=~\\".*/api/chat.*\\"', 'path=~\\".*/api/chat.*\\"', "no label 'path'"),
    ("panel-missing-reloads", "grafana/dashboards/adk-gateway.json", "increase(adk_gateway_config_reloads_total", "increase(adk_gateway_limited_total", "reloads (issue 7)"),
    ("panel-datasource", "grafana/dashboards/adk-gateway.json", '"uid": "prometheus"', '"uid": "prom"', "datasource 'prom'"),
    ("datasource-port", "grafana/provisioning/datasources/prometheus.yml", "http://prometheus:9090", "http://prometheus:9091", "9091"),
    ("dashboards-path", "grafana/provisioning/dashboards/adk-gateway.yml", "path: /etc/grafana/dashboards", "path: /var/lib/grafana/dashboards",
     "/var/lib/grafana/dashboards is not a mounted folder"),
    ("variable-label", "grafana/dashboards/adk-gateway.json", 'adk-gateway\\"}, instance)', 'adk-gateway\\"}, replica)', "'replica'"),
]


def _broken_copy(tmp: Path, rel: str, old: str, new: str) -> Path:
    deploy = tmp / "deploy"
    shutil.copytree(DEPLOY, deploy)
    (tmp / "config").symlink_to(ROOT / "config")  # compose mounts ../config
    path = deploy / rel
    text = path.read_text(encoding="utf-8")
    assert old in text, f"{rel} no longer contains {old!r}: update this breakage"
    path.write_text(text.replace(old, new), encoding="utf-8")
    return deploy


def test_an_unbroken_copy_passes(tmp_path: Path, exported: dict[str, set[str]]) -> None:
    deploy = tmp_path / "deploy"
    shutil.copytree(DEPLOY, deploy)
    (tmp_path / "config").symlink_to(ROOT / "config")
    _assert_none(all_problems(deploy, exported))


@pytest.mark.parametrize(("rel", "old", "new", "expected"), [b[1:] for b in BREAKAGES], ids=[b[0] for b in BREAKAGES])
def test_each_check_reports_a_broken_copy(tmp_path: Path, exported, rel: str, old: str, new: str, expected: str) -> None:
    deploy = _broken_copy(tmp_path, rel, old, new)
    try:
        problems = all_problems(deploy, exported)
    except Exception as exc:  # noqa: BLE001 - a crash is not a report
        pytest.fail(f"the checks crashed on the broken copy instead of reporting it: {exc!r}")
    assert any(expected in p for p in problems), f"no problem mentions {expected!r}; reported:\n" + "\n".join(problems)


# --------------------------------------------------------------------------------------------------
# Prometheus's own validator, when installed (Debian's `prometheus` package ships promtool).

def test_promtool_accepts_the_config_and_rules(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        # `make test` installs it: a missing promtool is a broken set-up, not a reason to pass.
        pytest.fail("promtool is not installed: `make promtool` (Debian's prometheus package)")
    for rules in Kit(DEPLOY).alert_files():
        run = subprocess.run([promtool, "check", "rules", str(rules)], capture_output=True, text=True, timeout=60)
        assert run.returncode == 0, f"promtool check rules {rules.name}:\n{run.stdout}{run.stderr}"
    # The config names container paths; check a copy whose rule_files point at the host files.
    config = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    config["rule_files"] = [str(DEPLOY / "prometheus" / Path(p).name) for p in config.get("rule_files") or []]
    copy = tmp_path / "prometheus.yml"
    copy.write_text(yaml.safe_dump(config))
    run = subprocess.run([promtool, "check", "config", str(copy)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, f"promtool check config:\n{run.stdout}{run.stderr}"


# --------------------------------------------------------------------------------------------------
# The real nginx.conf in front of two real gateways, when nginx is installed.

@dataclass
class LbStack:
    public: str
    internal: str
    secret: str
    replicas: list[str]  # base URLs of the gateways


def _nginx_binary() -> str | None:
    return shutil.which("nginx") or next((p for p in ("/usr/sbin/nginx",) if os.access(p, os.X_OK)), None)


def render_nginx_for_loopback(text: str, upstreams: dict[str, str], listens: dict[int, int], workdir: Path) -> str:
    """The kit's nginx.conf with service addresses and listen ports mapped to loopback ones, and
    temp paths in `workdir`; nothing else changes."""
    for address, local in upstreams.items():
        text, n = re.subn(rf"(\bserver\s+){re.escape(address)}(?=[\s;])", rf"\g<1>{local}", text)
        assert n, f"nginx.conf has no `server {address}`"
    for port, local in listens.items():
        text, n = re.subn(rf"(\blisten\s+)(?:[^\s;]*:)?{port}(?=[\s;])", rf"\g<1>127.0.0.1:{local}", text)
        assert n, f"nginx.conf has no `listen {port}`"
    temp = "".join(f"    {kind}_temp_path {workdir / kind};\n" for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
    return re.sub(r"^http\s*\{\n", lambda m: m.group(0) + temp, text, count=1, flags=re.M)


def _wait_port(port: int, proc: subprocess.Popen[Any], log: Path) -> None:
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"nginx exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=1)
            return
        except urllib.error.HTTPError:
            return
        except OSError:
            time.sleep(0.1)
    pytest.fail(f"nginx did not listen on {port}:\n{log.read_text()[-3000:]}")


@pytest.fixture(scope="module")
def lb_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LbStack]:
    binary = _nginx_binary()
    if binary is None:
        # `make test` installs it, so CI always runs the real nginx.conf; skipping would hide that.
        pytest.fail("nginx is not installed: `make nginx` (the checks against a running nginx need it)")
    from tests.faults.upstream import FaultUpstream

    kit = Kit(DEPLOY)
    config = kit.config(kit.gateways[0])
    assert config is not None and kit.nginx is not None, kit.problems
    http = _http(kit.nginx)
    tmp = tmp_path_factory.mktemp("ops-kit-nginx")
    secret = "ops-kit-" + os.urandom(6).hex()
    ports = {g: (free_port(), free_port()) for g in kit.gateways}
    upstreams = {}
    for members in _upstreams(http).values():  # type: ignore[arg-type]
        for member in members:
            host, port = member.rsplit(":", 1)
            public, internal = ports[host]
            upstreams[member] = f"127.0.0.1:{public if int(port) == config.listen.port else internal}"
    listens = {port: free_port() for port in _servers_by_port(http)}  # type: ignore[arg-type]
    workdir = tmp / "nginx"
    workdir.mkdir()
    conf = workdir / "nginx.conf"
    conf.write_text(render_nginx_for_loopback((DEPLOY / "nginx" / "nginx.conf").read_text(), upstreams, listens, workdir))
    with ExitStack() as stack:
        adk = stack.enter_context(FaultUpstream().running())
        bases = []
        for name in kit.gateways:
            public, internal = ports[name]
            extra = f"internal:\n  port: {internal}\n  secret: {secret}\nchat:\n  keepalive_interval: 1s\n"
            bases.append(stack.enter_context(gateway_process(tmp, adk, extra, port=public)).base)
        log = tmp / "nginx.log"
        directives = f"daemon off; pid {workdir / 'nginx.pid'};" + (" user root;" if os.geteuid() == 0 else "")
        with log.open("w") as out:
            proc = subprocess.Popen(
                [binary, "-p", str(workdir), "-c", str(conf), "-e", str(workdir / "error.log"), "-g", directives],
                stdout=out, stderr=subprocess.STDOUT,
            )
        try:
            public_port = listens[published_container_ports(kit.services[kit.one("nginx", "lb") or ""])[0]]
            internal_port = listens[urlsplit(service_env(kit.services["agent"])["ADK_GATEWAY_URL"]).port]  # type: ignore[index]
            _wait_port(public_port, proc, log)
            yield LbStack(f"http://127.0.0.1:{public_port}", f"http://127.0.0.1:{internal_port}", secret, bases)
        finally:
            stop_process(proc)


def _get(url: str, headers: dict[str, str] | None = None, method: str = "GET") -> tuple[int, bytes]:
    request = urllib.request.Request(url, headers=headers or {}, method=method)
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _chat(text: str, chat_id: str) -> dict[str, Any]:
    return {"id": chat_id, "messages": [{"id": "u1", "role": "user", "parts": [{"type": "text", "text": text}]}]}


def _requests(base: str, route: str) -> float:
    """adk_gateway_http_requests_total of one route, all methods and statuses."""
    text = _get(f"{base}/metrics")[1].decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("adk_gateway_http_requests_total{") and f'route="{route}"' in line)


def test_nginx_spreads_browsers_over_every_replica_and_hides_metrics(lb_stack: LbStack) -> None:
    # /readyz: nothing else calls it (the process helper polls /healthz).
    before = [_requests(base, "/readyz") for base in lb_stack.replicas]
    for _ in range(6):
        status, _ = _get(f"{lb_stack.public}/readyz")
        assert status in (200, 503)
    for base, count in zip(lb_stack.replicas, before):
        assert _requests(base, "/readyz") > count, f"nginx sent no request to the replica at {base}"
    status, body = _get(f"{lb_stack.public}/metrics")
    assert status == 404 and b"adk_gateway_" not in body, "nginx serves the gateways' /metrics to browsers"


async def test_nginx_streams_sse_unbuffered(lb_stack: LbStack) -> None:
    # The fake agent sends one event and then nothing for 4 s, while the gateway writes a
    # ": keep-alive" line every second (chat.keepalive_interval: 1s): each must reach the client when
    # written, not when the stream ends.
    arrivals: list[tuple[float, bytes]] = []
    async with aiohttp.ClientSession() as session:
        started = time.monotonic()
        async with session.post(f"{lb_stack.public}/api/chat", json=_chat("fault:hang:4", "ops-sse")) as resp:
            assert resp.status == 200, await resp.text()
            async for line in resp.content:
                if line.strip():
                    arrivals.append((time.monotonic() - started, line.strip()))
    ended = time.monotonic() - started
    assert arrivals and arrivals[0][1].startswith(b"data:"), arrivals
    assert ended >= 3.5, f"the stream ended after {ended:.1f}s; the fake agent should have held it 4s"
    keepalives = [t for t, line in arrivals if line.startswith(b":")]
    assert arrivals[0][0] < 2.0, f"the first chunk arrived after {arrivals[0][0]:.1f}s (stream ended at {ended:.1f}s): nginx buffers SSE"
    assert len(keepalives) >= 2 and keepalives[0] < ended - 1.5, (
        f"keep-alive lines arrived at {[round(t, 1) for t in keepalives]}s, the stream ended at {ended:.1f}s: nginx buffers SSE"
    )


async def test_nginx_upgrades_same_origin_websockets(lb_stack: LbStack) -> None:
    async with aiohttp.ClientSession() as session:
        async with session.ws_connect(f"{lb_stack.public.replace('http', 'ws')}/api/chat/ws", headers={"Origin": lb_stack.public}) as ws:
            assert not ws.closed
            await ws.close()


def test_nginx_passes_bodies_up_to_the_gateway_limit(lb_stack: LbStack) -> None:
    body = json.dumps(_chat("x" * (2 * 1024 * 1024), "ops-big")).encode()
    request = urllib.request.Request(f"{lb_stack.public}/api/chat", data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            status = resp.status
            resp.read()
    except urllib.error.HTTPError as exc:
        status = exc.code
    assert status == 200, f"a 2 MiB chat request (under chat.max_body_bytes) got {status} through nginx"


def test_nginx_internal_port_reaches_every_replica_internal_listener(lb_stack: LbStack) -> None:
    status, body = _get(f"{lb_stack.internal}/internal/v1/policy", {"Authorization": f"Bearer {lb_stack.secret}"})
    assert status == 200 and "tools" in json.loads(body), body
    for _ in range(6):
        assert _get(f"{lb_stack.internal}/internal/v1/policy", {"Authorization": "Bearer wrong"})[0] == 401
    for base in lb_stack.replicas:
        assert metric_value(base, "adk_gateway_plugin_requests_total", {"result": "unauthorized"}) >= 1, (
            f"nginx's internal port sent nothing to the internal listener of the replica at {base}"
        )
    status, _ = _get(f"{lb_stack.internal}/internal/v1/reload", {"Authorization": f"Bearer {lb_stack.secret}"}, method="POST")
    assert status == 409, f"POST /internal/v1/reload through the balancer answered {status}; it must not reach one replica"
