# Two commands on a fresh machine (Python 3.11, Node 20, npm, apt):
#   make run    set everything up and serve the gateway in front of the demo agent
#   make test   set everything up and run every test
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
JS_STAMP := tests/js/node_modules/.installed-stamp
DEMO_BUNDLE := gateway/static/demo/app.js
PYTEST_ARGS ?=
# Some machines set PYTHONDONTWRITEBYTECODE=1 for every process: then each gateway and ADK server a
# test starts compiles the gateway's modules again, and pytest rewrites every test module's asserts
# again in each xdist worker and in the serial ops run. Bytecode in __pycache__ (git-ignored) is the
# default Python behaviour; the targets here get it back.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: run run-live test venv js check-config clean chromium redis-server promtool nginx

# An app on another origin: GATEWAY_ALLOWED_ORIGINS=http://localhost:3000 make run (config/gateway.yaml reads
# it into auth.allowed_origins; comma-separated for several). PORT=... moves the gateway off 8080.
# The agent keeps its ADK sessions in .adk-gateway/sessions.db (SQLite, git-ignored), so an agent restart
# keeps them; DEMO_SESSION_STORE=memory (or sqlite:PATH) make run chooses another store (docs/demo.md).
run: $(STAMP) $(DEMO_BUNDLE)
	$(VENV)/bin/adk-gateway demo

# The same demo with the agent in ADK live mode (/run_live): a session per chat, audio-capable.
run-live: $(STAMP) $(DEMO_BUNDLE)
	$(VENV)/bin/adk-gateway demo --upstream-mode live

# The same demo with the agent on another google-adk release: `make run-adk ADK=1.22.1`. The agent
# runs the stock `adk api_server` of its own venv, .venv-adk-$(ADK), holding google-adk==$(ADK) and
# the plugin installed there as docs/approvals.md tells an operator (`pip install ./plugin`, which
# must change no installed version: gateway/demo/adk_venv.py checks it). The gateway in front is
# this checkout's. The first run for a version builds that venv (about a minute); PORT as for `run`.
# MODE=live: the agent behind /run_live, as `make run-live`.
ADK ?=
MODE ?= sse
.PHONY: run-adk
run-adk: $(STAMP) $(DEMO_BUNDLE)
	@test -n "$(ADK)" || { echo "usage: make run-adk ADK=<google-adk release>, e.g. ADK=1.22.1" >&2; exit 2; }
	$(PY) -m gateway.demo.adk_venv $(ADK)
	$(VENV)/bin/adk-gateway demo --agent-venv .venv-adk-$(ADK) --upstream-mode $(MODE)

# Every test on the newest google-adk (the project venv's). The older supported releases are
# `make compat`'s (ADK_VERSIONS empty here), which keeps this suite within CI's time budget.
# In parallel: TEST_WORKERS pytest-xdist workers (more than the cores: the suite mostly waits on
# the processes it starts), the tests that share a process grouped on one worker (tests/conftest.py,
# pyproject's addopts). Serial: `make test TEST_WORKERS=0`, or PYTEST_ARGS="-n 0" (docs/testing.md).
# tests/ops runs afterwards, alone and serially: its replicas see a death through sub-second
# heartbeats, which parallel workers starve of CPU (the survivors then answer the documented 503
# "retry", not what a row asserts). With PYTEST_ARGS, one run of that selection, in parallel.
TEST_WORKERS ?= 4
test: $(STAMP) $(JS_STAMP) $(DEMO_BUNDLE) chromium redis-server promtool nginx
	if [ -n "$(strip $(PYTEST_ARGS))" ]; then \
		ADK_VERSIONS= $(PY) -m pytest -m "not chaos" -n $(TEST_WORKERS) $(PYTEST_ARGS); \
	else \
		ADK_VERSIONS= $(PY) -m pytest -m "not chaos" -n $(TEST_WORKERS) --ignore=tests/ops; a=$$?; \
		ADK_VERSIONS= $(PY) -m pytest -m "not chaos" -n 0 tests/ops; b=$$?; \
		test $$a -eq 0 && test $$b -eq 0; \
	fi

# `make test`'s runs under coverage.py, for line and branch coverage of gateway/ and the ADK plugin
# (docs/testing.md, which records the baseline): the same two runs (in parallel without tests/ops,
# then tests/ops alone and serially), or PYTEST_ARGS's one, each `coverage run`, then one report of
# them all. The gateways and ADK API servers the tests start are measured too, and so are the xdist
# workers ([tool.coverage.run] in pyproject.toml: patch = subprocess, sigterm): every process writes
# its own data file (parallel = true), `coverage combine` merges them. Prints coverage.py's per-file
# report, then a per-package table and the totals (.ci/coverage_summary.py); `coverage html`
# afterwards shows the lines. Fails when a test fails, after reporting.
.PHONY: coverage
coverage: $(STAMP) $(JS_STAMP) $(DEMO_BUNDLE) chromium redis-server promtool nginx
	rm -f .coverage .coverage.*
	if [ -n "$(strip $(PYTEST_ARGS))" ]; then \
		ADK_VERSIONS= $(PY) -m coverage run -m pytest -m "not chaos" -n $(TEST_WORKERS) $(PYTEST_ARGS); \
	else \
		ADK_VERSIONS= $(PY) -m coverage run -m pytest -m "not chaos" -n $(TEST_WORKERS) --ignore=tests/ops; a=$$?; \
		ADK_VERSIONS= $(PY) -m coverage run -m pytest -m "not chaos" -n 0 tests/ops; b=$$?; \
		test $$a -eq 0 && test $$b -eq 0; \
	fi; status=$$?; \
		$(PY) -m coverage combine -q && $(PY) -m coverage report && $(PY) .ci/coverage_summary.py; \
		exit $$status

# The integration scenarios against every supported google-adk release in COMPAT_ADK (each in its
# own .venv-adk-<version>, built once, about 45 s): every demo row with the stock ai 6 and ai 7
# Chats over SSE and WebSocket, SSE and live upstream, the plugin's checks and the approval row, and
# a pending ADK confirmation across a kill -9 of the ADK server (SQLite sessions keep it, memory:// is a 410),
# and `upstream.approvals: confirm` (the plugin asking ADK's confirmation, browser tools, timeouts,
# a gateway killed meanwhile, a reloaded page resuming into the approval). The newest release
# (2.13) is the project venv's, which every `make test` runs. The fault table on an older ADK:
# `OPS_ADK_VERSION=1.22.1 make chaos`.
COMPAT_ADK ?= 1.22.1,1.39.1
.PHONY: compat
compat: $(STAMP) $(JS_STAMP) redis-server
	ADK_VERSIONS=$(COMPAT_ADK) $(PY) -m pytest tests/integration/test_adk_versions.py tests/integration/test_adk_restart.py \
		tests/integration/test_confirm_mode.py tests/integration/test_confirm_timeouts.py \
		tests/integration/test_resume_rebuild.py tests/integration/test_ai_sdk_clients.py tests/integration/test_live_mode.py \
		tests/integration/test_session_auto_create.py \
		$(PYTEST_ARGS)

# The property-based bad-input suite at full size (>= 10,000 cases; `make test` runs its small ci profile).
.PHONY: fuzz
fuzz: $(STAMP) $(JS_STAMP)
	HYPOTHESIS_PROFILE=full $(PY) -m pytest tests/fuzz -q --timeout=3600

# The operations fault suite alone (tests/ops, about eight minutes): two replicas on Redis, the ADK
# server with the plugin and a ledger of real tool executions, and each row of docs/operations.md's
# "Failure modes" table proved, the durable-approval rows (the chatting user's and the approvers'),
# and 300 concurrent cross-replica approvals included. `make test` runs it too,
# but for the rows marked `chaos` (the slower durable-approval rows), which only this target runs.
.PHONY: chaos
chaos: $(STAMP) $(JS_STAMP) redis-server
	$(PY) -m pytest tests/ops $(PYTEST_ARGS)

# Benchmarks against nginx and a bare aiohttp proxy (docs/performance.md): a table, and
# bench/results.json. A few minutes on 2 cores. BENCH_ARGS='--only sse,idle' narrows a run.
.PHONY: bench
bench: $(STAMP) nginx
	$(PY) -m bench $(BENCH_ARGS)

venv: $(STAMP)

# The ADK plugin is its own distribution (plugin/, adk-gateway-plugin): installed here for the demo
# agent, the tests and the gateway.agent_plugin alias. The daemon's pyproject does not depend on it.
$(STAMP): pyproject.toml plugin/pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ./plugin -e '.[test]'
	touch $@

js: $(JS_STAMP)

$(JS_STAMP): tests/js/package.json tests/js/package-lock.json
	cd tests/js && npm ci --no-audit --no-fund --loglevel=error
	touch $@

# The demo pages (web/, see docs/demo.md): the AI SDK page at /, the AG-UI page at /agui (@ag-ui/client)
# and the approvals inbox, bundled by esbuild into gateway/static/demo/ (git-ignored) in one build,
# rebuilt when any of their sources (web/src/*) or pinned packages change; app.js stands for the lot.
$(DEMO_BUNDLE): $(wildcard web/src/*) web/build.mjs web/package.json web/package-lock.json
	cd web && npm ci --no-audit --no-fund --loglevel=error && node build.mjs
	touch $@

# tests/browser drive Debian's chromium (CI runs as root, so apt-get works there).
chromium:
	command -v chromium >/dev/null || (apt-get update && apt-get install -y chromium)

# The multi-replica tests and the Redis backend's contract tests start real redis-servers.
redis-server:
	command -v redis-server >/dev/null || test -x /usr/bin/redis-server || (apt-get -o DPkg::Lock::Timeout=300 update && apt-get -o DPkg::Lock::Timeout=300 install -y redis-server)
	# The Sentinel failover test (tests/ops/test_sentinel_failover.py) runs three redis-sentinels.
	command -v redis-sentinel >/dev/null || test -x /usr/bin/redis-sentinel || (apt-get -o DPkg::Lock::Timeout=300 update && apt-get -o DPkg::Lock::Timeout=300 install -y redis-sentinel)

# tests/test_alert_rules.py runs the alert rules' unit tests with promtool, which Debian ships in
# its prometheus package.
promtool:
	command -v promtool >/dev/null || test -x /usr/bin/promtool || (apt-get -o DPkg::Lock::Timeout=300 update && apt-get -o DPkg::Lock::Timeout=300 install -y --no-install-recommends prometheus)

# tests/test_ops_kit.py runs deploy/nginx/nginx.conf for real in front of gateways, and `make bench`
# measures against nginx: Debian's nginx package (the tests and the bench start their own nginx
# on loopback ports with a config of their own).
nginx:
	command -v nginx >/dev/null || test -x /usr/sbin/nginx || (apt-get -o DPkg::Lock::Timeout=300 update && apt-get -o DPkg::Lock::Timeout=300 install -y --no-install-recommends nginx)

check-config: $(STAMP)
	$(VENV)/bin/adk-gateway check-config config/gateway.yaml

clean:
	rm -rf $(VENV) tests/js/node_modules .pytest_cache .coverage .coverage.* htmlcov
