# Two commands from nothing (see README): `make plan` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: plan test unit integration bench clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	# torch==2.13.0 is the CPU build (pinned in pyproject's torch extra); never a CUDA build
	$(PY) -m pip install -q -e '.[torch,dev]'
	touch $@

plan: $(VENV)/.installed
	$(VENV)/bin/symtensor plan

# the unit tests (CPU, under a minute), then the integration runs (torchrun processes, end to end)
test: unit integration

unit: $(VENV)/.installed
	$(PY) -m pytest tests/unit

integration: $(VENV)/.installed
	$(PY) -m pytest tests/integration

bench: $(VENV)/.installed
	$(PY) benchmarks/cost_model_fidelity.py

clean:
	rm -rf $(VENV) build *.egg-info
