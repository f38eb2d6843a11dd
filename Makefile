# One entry point for a newcomer: `make run` starts gpupool, `make test` runs every test.
# Both do their own set-up into .venv (and build native/), so they work on a fresh machine.
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip

.PHONY: setup run test lint native bench clean system k8s dex fuzz

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -e '.[test]'
	touch $@

native: setup
	@if [ -f native/Makefile ]; then $(MAKE) -C native; fi

# System packages and Node tools for the hub (chromium, configurable-http-proxy, code-server).
system:
	scripts/setup-system

run: setup system native
	$(VENV)/bin/gpupool up

# The local Kubernetes test cluster's binaries, helm and dockerfile-lint (built once from Go
# modules, cached in ~/.cache/gpupool).
k8s:
	scripts/test-cluster build >/dev/null

# Dex, the OIDC provider of the single sign-on tests (built once, cached in ~/.cache/gpupool).
dex:
	scripts/build-dex >/dev/null

lint: setup
	$(VENV)/bin/ruff check .

test: setup system native lint k8s dex
	$(VENV)/bin/pytest -q tests

# The scheduler's property tests with a long random profile (CI runs a fixed, short one).
fuzz: setup
	HYPOTHESIS_PROFILE=fuzz $(VENV)/bin/pytest -q tests/scheduler/test_guarantee_properties.py

clean:
	rm -rf $(VENV) native/build
