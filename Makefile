# Two commands do all the setup on a fresh machine: `make demo` and `make test`.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# Most slow tests wait on real time (scrapes, windows, processes), not on the CPU: more workers than
# the two cores. tests/conftest.py refines loadscope: a module whose tests share a fixture (a stack, a
# Prometheus) stays on one worker so it starts once, every other test is a unit of its own, and the
# units go out longest first in the order it sorts them (hence --no-loadscope-reorder).
PYTEST_WORKERS ?= 4
PYTEST_PARALLEL ?= -n $(PYTEST_WORKERS) --dist loadscope --no-loadscope-reorder
# The slowest tests of every run, to see where the time goes.
PYTEST_REPORT ?= --durations=30

.PHONY: setup prometheus browser demo test test-fast test-faults test-fuzz release-check lint typecheck bench schema clean

$(PY):
	python3 -m venv $(VENV)

$(STAMP): pyproject.toml sandbox/pyproject.toml | $(PY)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ./sandbox -e '.[dev,demo]'
	touch $(STAMP)

setup: $(STAMP) prometheus

# Debian's Prometheus: the tests and the demo start their own server from this binary.
prometheus:
	@if ! command -v prometheus >/dev/null 2>&1 || ! command -v promtool >/dev/null 2>&1; then \
		echo "installing Debian's prometheus package"; \
		if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
		$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends prometheus >/dev/null; \
		$$SUDO systemctl disable --now prometheus >/dev/null 2>&1 || true; \
	fi

# Debian's chromium and chromium-driver: tests/dashboard drive the dashboard's page in a headless
# browser (the demo does not need them).
browser:
	@if ! command -v chromedriver >/dev/null 2>&1; then \
		echo "installing Debian's chromium and chromium-driver packages"; \
		if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
		$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends chromium chromium-driver >/dev/null; \
	fi

lint: $(STAMP)
	$(VENV)/bin/ruff check canary sandbox tests benchmarks
	$(VENV)/bin/ruff format --check canary sandbox tests benchmarks
	$(VENV)/bin/lint-imports --no-cache

typecheck: $(STAMP)
	$(VENV)/bin/mypy --strict canary sandbox/canary_sandbox

# Every worker collects every test, and pytest rewrites each test module's asserts on import unless
# the rewritten module is cached in __pycache__: one collection first (errors show in the run after it)
# writes that cache, so the workers' collections take a third of the CPU (about 8 s each instead of 26
# under coverage). PYTHONDONTWRITEBYTECODE, when the environment sets it, would keep it from being written.
PYTEST_ENV := env -u PYTHONDONTWRITEBYTECODE

# The suites that run after it, each a target of its own with its budget (CI runs them all after
# `make test`, in .ci/run): their coverage is added to this run's (coverage combine --append).
AFTER_TEST := tests/faults tests/fuzz

test: setup browser lint typecheck
	$(VENV)/bin/coverage erase
	$(PYTEST_ENV) $(VENV)/bin/pytest -qq --collect-only $(AFTER_TEST:%=--ignore=%) >/dev/null 2>&1 || true
	$(PYTEST_ENV) $(VENV)/bin/coverage run -m pytest -q $(PYTEST_PARALLEL) $(PYTEST_REPORT) $(AFTER_TEST:%=--ignore=%)
	$(VENV)/bin/coverage combine -q
	$(VENV)/bin/coverage report --precision=1 | tail -n 25
	$(VENV)/bin/coverage report --precision=1 --include='canary/rollout/*' --fail-under=95

# A suite that runs after `make test`: its tests in parallel under coverage, its measurement added to
# the one `make test` left (.coverage), and the coverage of all that ran reported.
define suite_after_test
	$(PYTEST_ENV) $(VENV)/bin/coverage run -m pytest -q $(PYTEST_PARALLEL) $(PYTEST_REPORT) $(1)
	$(VENV)/bin/coverage combine -q --append
	@echo "coverage of make test with $(1) added (and any suite run after it before):"
	@$(VENV)/bin/coverage report --precision=1 | tail -n 1
	@$(VENV)/bin/coverage report --precision=1 --include='canary/rollout/*' | tail -n 1
endef

# The fault suite: the e2e stack with faults injected (Prometheus, the API, the receiver, kills,
# state loss), the never-happen invariants checked from the API's records. Budget: 4 minutes on the
# two-core machine (docs/performance.md).
test-faults: setup
	$(call suite_after_test,tests/faults)

# The fuzz suite: thousands of generated and mutated policies, states, commands and Prometheus answers
# (FUZZ_SCALE scales it), and the judge's error rates simulated. Budget: 3 minutes on the two-core
# machine (docs/performance.md).
test-fuzz: setup
	$(call suite_after_test,tests/fuzz)

# Everything but the slow suites: tests/integration (real Prometheus), tests/e2e (the controller as
# a process), tests/faults (the same with faults injected) and tests/fuzz, marked by directory in
# tests/conftest.py,
# and the deploy tests that run the controller.
test-fast: setup browser
	$(VENV)/bin/pytest -q $(PYTEST_PARALLEL) -m "not integration and not e2e and not faults and not fuzz"

# The hostile-tenant suite (tests/hostile, issue #34): the same rollouts benign and with team A
# hostile, each in its own controller process, team B's delays and the peak memory measured. It runs
# only when asked for by path, so `make test` leaves it out; CI runs it after `make test`. Budget:
# 4 minutes (pytest-timeout; about 2 on the shared two-core machine).
.PHONY: test-hostile
test-hostile: setup
	$(VENV)/bin/pytest -q tests/hostile

# The release artefacts, built and checked without publishing (CI runs it after `make test`; the
# release workflow, .github/workflows/release.yml, publishes them): the sdist and the wheel built from
# it, each installed into a clean virtualenv (dependencies from the hashed lock's wheels, downloaded
# once into $(VENV)/wheelhouse) running `kserve-canary --help` and `validate policies/examples/`
# without the sandbox; the Dockerfile, statically; the chart, packaged by Helm's Go SDK, linted and
# rendered; the release workflow's steps. Output in build/release/.
release-check: $(STAMP)
	$(PY) -m tests.deploy.release check --out build/release --wheelhouse $(VENV)/wheelhouse

# The whole story on this machine: emulator, simulated fleet, real Prometheus, the controller; about a
# minute. Options through DEMO_ARGS, e.g. `make demo DEMO_ARGS="--speed 2 --no-ui"` or "--keep-running".
DEMO_ARGS ?=
demo: setup
	$(VENV)/bin/kserve-canary demo $(DEMO_ARGS)

bench: setup
	$(PY) -m benchmarks

# The policy file's JSON Schema and the PromotionPolicy CRD (one generated file, two copies: Kustomize
# and Helm each read only files under their own roots).
schema: $(STAMP)
	$(VENV)/bin/kserve-canary schema > policies/schema.json
	$(VENV)/bin/kserve-canary schema --crd > deploy/crds/promotionpolicies.yaml
	cp deploy/crds/promotionpolicies.yaml charts/kserve-canary/crds/promotionpolicies.yaml

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .coverage .coverage.*
