# Two commands from nothing (see README): `make plan` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: plan test lint unit integration bench clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	# torch==2.13.0 is the CPU build (pinned in pyproject's torch extra); never a CUDA build
	$(PY) -m pip install -q -e '.[torch,dev]'
	touch $@

plan: $(VENV)/.installed
	$(VENV)/bin/symtensor plan

# the linters (seconds), the unit tests (CPU, about a minute on 2 cores), then the integration runs (torchrun
# processes, torch captures, calibration fits, exhaustive searches: end to end)
test: lint unit integration

# ruff (style, import order, likely mistakes) and import-linter (the layers of ARCHITECTURE.md, no
# import circle, no torch in the planner), both configured in pyproject.toml
lint: $(VENV)/.installed
	$(VENV)/bin/ruff check src tests benchmarks
	$(VENV)/bin/lint-imports

# The tests start many Python processes (CLI entry points, torchrun ranks): they let Python cache
# the compiled modules (in the gitignored __pycache__ folders), which PYTHONDONTWRITEBYTECODE=1 in
# the environment turns off; otherwise each process compiles the package again (about 2 s of CPU).
TEST_ENV := PYTHONDONTWRITEBYTECODE=
# pytest-xdist workers: the integration tests that start processes run on one of them, one at a
# time, and the CPU-bound ones (fuzz cases, searches) on the other (tests/integration/conftest.py)
TEST_WORKERS ?= 2

unit: $(VENV)/.installed
	$(TEST_ENV) $(PY) -m pytest tests/unit -n $(TEST_WORKERS)

integration: $(VENV)/.installed
	$(TEST_ENV) $(PY) -m pytest tests/integration -n $(TEST_WORKERS)

bench: $(VENV)/.installed
	$(PY) benchmarks/cost_model_fidelity.py

clean:
	rm -rf $(VENV) build *.egg-info
