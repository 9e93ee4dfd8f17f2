# Two commands on a fresh machine (Python 3.11, Node 20, npm, apt):
#   make run    set everything up and serve the gateway in front of the demo agent
#   make test   set everything up and run every test
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
JS_STAMP := tests/js/node_modules/.installed-stamp
PYTEST_ARGS ?=

.PHONY: run run-live test venv js check-config clean

run: $(STAMP)
	$(VENV)/bin/adk-gateway demo

# The same demo with the agent in ADK live mode (/run_live): a session per chat, audio-capable.
run-live: $(STAMP)
	$(VENV)/bin/adk-gateway demo --upstream-mode live

test: $(STAMP) $(JS_STAMP)
	$(PY) -m pytest $(PYTEST_ARGS)

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $@

js: $(JS_STAMP)

$(JS_STAMP): tests/js/package.json tests/js/package-lock.json
	cd tests/js && npm ci --no-audit --no-fund --loglevel=error
	touch $@

check-config: $(STAMP)
	$(VENV)/bin/adk-gateway check-config config/gateway.yaml

clean:
	rm -rf $(VENV) tests/js/node_modules .pytest_cache
