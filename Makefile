# Two commands for a newcomer: `make repro` (set up + run the DAG on the demo) and
# `make test` (set up + run the tests). Both create or update .venv themselves.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
export PATH := $(CURDIR)/$(BIN):$(PATH)

.PHONY: repro test lint ui demo report clean-venv

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e .
	touch $@

$(VENV)/.installed-dev: pyproject.toml $(VENV)/.installed
	$(BIN)/pip install -q -e '.[dev]'
	touch $@

repro: $(VENV)/.installed  ## run (or re-run) the whole DAG on params.yaml
	dvc repro

test: $(VENV)/.installed-dev  ## the test suite
	$(BIN)/python -m pytest

lint: $(VENV)/.installed-dev
	$(BIN)/ruff check rarelm stages tests bench

ui: $(VENV)/.installed  ## MLflow UI on the local store, loopback only
	mlflow ui --backend-store-uri sqlite:///$(CURDIR)/mlflow.db --host 127.0.0.1 --port 5000

demo: $(VENV)/.installed  ## rebuild the committed demo corpora under data/raw/
	rarelm demo

# The committed run (HEAD, the experiments' baseline commit) against every DVC experiment of HEAD,
# seeds pooled, with paired term-bootstrap intervals: reports/index.html (self-contained),
# reports/report.md, reports/report.json. HEAD, not the workspace: `dvc exp run` without --queue
# leaves the last experiment's results in the workspace.
report: $(VENV)/.installed  ## compare the DVC experiments of HEAD with the committed run -> reports/
	rarelm compare --experiments --baseline HEAD --out reports
