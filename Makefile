# One entry point for a newcomer: `make run` starts gpupool, `make test` runs every test,
# `make docs` builds the docs site (docs/_build/html).
# Both do their own set-up into .venv (and build native/), so they work on a fresh machine.
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
# Embedded workloads run as per-user OS accounts, which must be able to run the venv's Python:
# prefer the system's Python (3.11+) to one inside a private home (pyenv under /root).
PYTHON3 ?= $(shell /usr/bin/python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null && echo /usr/bin/python3 || echo python3)

.PHONY: setup run test test-images lint native bench clean system k8s dex images peers bench-peers docs fuzz replay-sweep

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON3) -m venv $(VENV)
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

# The local Kubernetes test cluster's binaries, helm and dockerfile-lint, and the real node's
# kube-proxy, CoreDNS and host-path provisioner (built once from Go modules, cached in ~/.cache/gpupool).
k8s:
	scripts/test-cluster build --cluster-dns --provisioner >/dev/null

# Dex, the OIDC provider of the single sign-on tests (built once, cached in ~/.cache/gpupool).
dex:
	scripts/build-dex >/dev/null

# The chart's images from docker/*/Dockerfile, without Docker: buildah on a local Debian base,
# docker-archive tars cached in ~/.cache/gpupool/images by their inputs (scripts/build-images).
images: system
	scripts/build-images >/dev/null

# KAI-Scheduler, the peer that bench/peers runs beside gpupool-scheduler (built once from its
# released source in ../shared/peers/, cached in ~/.cache/gpupool).
peers:
	scripts/build-peers >/dev/null || [ $$? = 2 ]

# gpupool-scheduler, KAI-Scheduler and kube-scheduler on the same cluster, the same work.
bench-peers: setup k8s peers
	nice -n 10 $(PY) bench/peers

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy scheduler

test: setup system native lint k8s dex peers
	$(VENV)/bin/pytest -q tests

# The tests that need the chart's images (built first: 25-40 minutes cold on 2 cores, then
# cached): the images themselves, the chart's pods on the real node, a workspace pod there.
test-images: setup system native k8s images
	GPUPOOL_TEST_IMAGES=1 $(VENV)/bin/pytest -q -m images tests

# The scheduler's property tests with a long random profile (CI runs a fixed, short one).
fuzz: setup
	HYPOTHESIS_PROFILE=fuzz $(VENV)/bin/pytest -q tests/scheduler/test_guarantee_properties.py

# The guarantee on 50 drawn organisations (generator: organisations), static and gpupool per
# seed, with gpupool once more with consolidate_in_quota off: about 22 minutes of one core.
# CI replays three small draws (tests/test_sim_organisations.py).
replay-sweep: setup
	$(PY) bench/replay_org_sweep.py --seeds 1-50 --switch-off

# The docs site: Sphinx + MyST + pydata theme. -n -W --keep-going: any warning fails the
# build, an unresolved internal link (page or heading) included; external links are not
# checked, so it builds offline. The reference pages are generated from the code.
docs: setup $(VENV)/.docs-installed
	$(VENV)/bin/sphinx-build -n -W --keep-going -q -b html docs docs/_build/html

$(VENV)/.docs-installed: pyproject.toml
	$(PIP) install -q -e '.[docs]'
	touch $@

clean:
	rm -rf $(VENV) native/build docs/_build docs/reference/_generated
