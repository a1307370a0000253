# sidecar-medic: `make help` lists the targets.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# `make run` and `make demo` use a venv of their own with medic's runtime dependencies alone (no test or
# lint tools); ARGS go to the command, e.g. make run ARGS='--port 9500 --state-dir /tmp/medic-demo'
RUN_VENV ?= .venv-run
RUN_BIN := $(RUN_VENV)/bin
ARGS ?=

.PHONY: help install system-deps run demo test test-fast lint typecheck format bench clean

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-12s %s\n", $$1, $$2}'

# constraints.txt pins what the tests and the footprint figures were measured with (the image uses it too)
$(BIN)/medic: pyproject.toml setup.py constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -c constraints.txt setuptools
	$(BIN)/pip install -q -c constraints.txt -e '.[test,lint]'
	@touch $@

install: $(BIN)/medic  ## create .venv and install medic with its test and lint tools

$(RUN_BIN)/medic: pyproject.toml setup.py constraints.txt
	$(PYTHON) -m venv $(RUN_VENV)
	$(RUN_BIN)/pip install -q -c constraints.txt -e .
	@touch $@

system-deps:  ## install the Debian packages the tests need (root or sudo)
	./scripts/install-system-deps.sh

run: $(RUN_BIN)/medic  ## the agent alone in .venv-run, on its built-in demo: a leak finding and its suspect within 2 minutes (http://127.0.0.1:9464/)
	$(RUN_BIN)/medic run $(ARGS)

demo: $(RUN_BIN)/medic  ## real onnxruntime servers (healthy, leaking, slow) and medic restarting them, narrated
	$(RUN_BIN)/pip install -q -c constraints.txt -e '.[demo]'
	$(RUN_BIN)/medic demo $(ARGS)

# four workers on two cores: the slow tests mostly wait on real processes and servers; each file
# runs in one worker (--dist loadfile), so a file's tests keep their order and their servers
test: system-deps install lint typecheck  ## install everything and run the whole test suite
	$(BIN)/python -m pytest -n 4 --dist loadfile

test-fast: install lint  ## unit tests only (no slow, root or native ones): under 2 minutes
	$(BIN)/python -m pytest -q -n 2 -m "not slow and not root and not native"

lint: install  ## ruff lint and format check
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# every product package is held to mypy (strict, pyproject.toml)
TYPED := agent probes remediation native_hooks medic_hook dashboards

typecheck: install  ## strict mypy on every product package
	$(BIN)/mypy $(TYPED)

format: install  ## apply ruff's fixes and formatting
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

bench: install  ## print the benchmark figures quoted in docs/
	$(BIN)/python benchmarks/probe_cost.py

clean:  ## remove the virtualenvs and caches
	rm -rf $(VENV) $(RUN_VENV) .pytest_cache .ruff_cache .hypothesis medic-state
