"""Shared fixtures: a throw-away copy of the repo with a tiny corpus, and a CLI runner; the builders
of such copies and of tiny staged folders, and the fixtures that several test files use; how the
suite runs on pytest-xdist workers (`make test`: `pytest -n 2`). Shared plain helpers that need no
fixture or repo copy: tests/helpers.py."""

from __future__ import annotations

import fcntl
import importlib.util
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TypeVar

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def run(args: list[str], cwd: Path, env: dict | None = None, check: bool = False,
        timeout: float = 600) -> subprocess.CompletedProcess:
    """Run a command with the test venv's executables first on PATH."""
    full_env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
                "PYTHONUNBUFFERED": "1", **(env or {})}
    result = subprocess.run(args, cwd=cwd, env=full_env, capture_output=True, text=True,
                            timeout=timeout)
    if check and result.returncode != 0:
        raise AssertionError(f"{args} exited {result.returncode}\n{result.stdout}\n{result.stderr}")
    return result


def stage(name: str, cwd: Path, *args: str, **kwargs) -> subprocess.CompletedProcess:
    """Run `python -m stages.<name>` in cwd, as dvc.yaml does."""
    return run([sys.executable, "-m", f"stages.{name}", *args], cwd, **kwargs)


def assert_user_error(result: subprocess.CompletedProcess, message: str, root: Path,
                      *absent: str, stage: str = "") -> None:
    """An expected failure: exit 2, one stderr line (`rarelm <stage>: error: ...` holding
    `message`), no traceback, and none of the `absent` paths under root left behind."""
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    prefix = f"rarelm {stage}: error:" if stage else "rarelm "
    assert lines[0].startswith(prefix) and message in lines[0], lines[0]
    for rel in absent:
        assert not (root / rel).exists(), rel


def set_params(root: Path, **overrides) -> None:
    """Set params in root/params.yaml: set_params(root, alpha=0.5, **{"train.max_steps": 3})."""
    path = root / "params.yaml"
    params = yaml.safe_load(path.read_text())
    for key, value in overrides.items():
        *parents, leaf = key.split(".")
        node = params
        for p in parents:
            node = node[p]
        node[leaf] = value
    path.write_text(yaml.safe_dump(params, sort_keys=False, allow_unicode=True))


T = TypeVar("T")


def pytest_configure(config) -> None:
    """On an xdist worker, torch in the test process computes on its share of the cores: two
    workers with one thread each on two cores, instead of each oversubscribing both."""
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if workers:
        import torch

        torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(workers)))


# The files whose tests take minutes (queued DVC experiments, whole-DAG runs, torchrun): first in
# the collection, so that the workers end on short tests together, not one on a long test alone.
SLOW_FIRST = ("tests/test_headline.py", "tests/test_reliability.py", "tests/test_train.py",
              "tests/test_pipeline.py")
# Files whose expensive fixtures are session-scoped and `built_once`: their tests are spread over
# the xdist workers one by one; every other file goes to one worker whole (its module fixtures
# are built once).
SPREAD = ("tests/test_reliability.py",)


# `make test-fast` (`pytest -m "not slow"`) leaves out what takes minutes: whole-DAG runs, torchrun
# training, DVC experiments and queues; `make test` runs everything. Slow are the tests of
# SLOW_FILES, those that use a fixture named in SLOW_FIXTURES for their file (it builds such a run,
# so a new test on it is slow without being listed), and SLOW_TESTS. tests/test_conftest.py checks
# that every name here still exists. (A test can also carry `@pytest.mark.slow` itself.)
SLOW_FILES = ("tests/test_pipeline.py", "tests/test_reliability.py", "tests/test_early_stop.py")
SLOW_FIXTURES = {
    "tests/test_train.py": {"trained"},  # dvc repro with two DDP processes, then more runs on it
    "tests/test_headline.py": {"repo"},  # three rounds of queued DVC experiments
    "tests/test_compare.py": {"dvc_repo"},  # `dvc exp run --temp` experiments
    "tests/test_evaluate.py": {"repo"},  # dvc repro through evaluate
    "tests/test_weights.py": {"repo"},  # dvc repro weights, en then zh
    "tests/test_smollm2.py": {"repo"},  # a fine-tune of the converted llama through evaluate
}
SLOW_TESTS = {
    "tests/test_train.py::test_gpu_check_falls_back_to_cpu_without_a_gpu",  # five short trainings
    "tests/test_release.py::test_release_tags_the_model_that_dvc_artifacts_get_downloads",  # DVC remote
    # the longest of the rest (40-70 s each in the fast lane at load ~10, 2026-12-03): a whole
    # evaluate stage, MLflow registry round trips, three processes creating one store
    "tests/test_evaluate.py::test_stage_writes_metrics_plots_and_logs_into_the_training_run",
    "tests/test_evaluate.py::test_stage_with_logit_adjustment_scores_the_adjusted_model",
    "tests/test_compare.py::test_cli_registers_the_winner_and_leaves_the_champion",
    "tests/test_compare.py::test_cli_compares_mlflow_runs_by_id",
    "tests/test_tracking.py::test_three_writers_on_a_fresh_store_all_log",
}


def is_slow(nodeid: str, fixtures: Iterable[str]) -> bool:
    """Whether a test belongs to the slow lane by the lists above.

    >>> is_slow("tests/test_train.py::test_crash[fp32]", ["trained", "tmp_path"])
    True
    >>> is_slow("tests/test_train.py::test_lr_warms_up_then_decays_to_min_lr", [])
    False
    """
    path = nodeid.split("::")[0]
    return (path in SLOW_FILES or bool(SLOW_FIXTURES.get(path, set()) & set(fixtures))
            or nodeid.split("[")[0] in SLOW_TESTS)


@pytest.hookimpl(tryfirst=True)  # marked before `-m "not slow"` deselects
def pytest_collection_modifyitems(config, items) -> None:
    """Mark the slow tests; the SLOW_FIRST files first, in that order; the order within a file stays."""
    for item in items:
        if is_slow(item.nodeid, getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)

    def rank(item) -> int:
        path = item.nodeid.split("::")[0]
        return SLOW_FIRST.index(path) if path in SLOW_FIRST else len(SLOW_FIRST)

    items.sort(key=rank)


if importlib.util.find_spec("xdist"):
    @pytest.hookimpl(optionalhook=True)  # also with xdist installed but off (`-p no:xdist`)
    def pytest_xdist_make_scheduler(config, log):
        """`pytest -n 2` (make test): each file's tests on one worker, as `--dist loadscope`, except
        the SPREAD files' tests, one by one; work handed out in collection order. (xdist_group
        marks would be finer, but xdist 3.8's `--dist loadgroup` cannot rename pytest 9.2's node
        ids, so it groups nothing.)"""
        from xdist.scheduler import LoadScopeScheduling

        class FilesWhole(LoadScopeScheduling):
            def _split_scope(self, nodeid: str) -> str:
                path = nodeid.split("::")[0]
                return nodeid if path in SPREAD else path

        config.option.loadscopereorder = False  # largest files first would undo SLOW_FIRST
        return FilesWhole(config, log)


def built_once(tmp_path_factory, name: str, build: Callable[[Path], T]) -> T:
    """`build(folder)` once per test session, even across xdist workers: the first worker to ask
    builds in a folder that all workers see and pickles the result beside it, the others wait on
    a lock and unpickle it. Without xdist, plainly `build` in a fresh folder. The result must
    pickle, and the tests that use the folder must only read it (copy it to change it)."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return build(tmp_path_factory.mktemp(name))
    shared = tmp_path_factory.getbasetemp().parent  # the session's folder, above each worker's
    done = shared / f"{name}.pickle"
    with open(shared / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if done.is_file():
            return pickle.loads(done.read_bytes())
        result = build(Path(tempfile.mkdtemp(prefix=f"{name}-", dir=shared)))
        done.write_bytes(pickle.dumps(result))
        return result


def pytest_report_header(config) -> str:
    """Which way `train.precision: auto` resolves in this run: the suite passes either way, and
    RARELM_CPU_BF16=0|1 runs it as on the other kind of CPU."""
    from rarelm.errors import RarelmError
    from rarelm.train.precision import CPU_BF16_ENV, cpu_has_bf16, cpu_has_native_bf16

    native = "with" if cpu_has_native_bf16() else "without"
    try:
        auto = "bf16" if cpu_has_bf16() else "fp32"
    except RarelmError as exc:
        return f"rarelm: CPU {native} native bf16; {exc}"
    forced = os.environ.get(CPU_BF16_ENV)
    how = f" ({CPU_BF16_ENV}={forced})" if forced else ""
    return f"rarelm: CPU {native} native bf16; train.precision auto = {auto}{how}"


TINY = {"n_terms": 40, "top_count": 30, "filler_sentences": (3, 6)}


@pytest.fixture(scope="session")
def tiny_raw(tmp_path_factory) -> Path:
    """Tiny demo corpora (en and zh) with their glossaries, built once per session."""
    from rarelm.prepare.demo import write

    out = tmp_path_factory.mktemp("raw")
    write(out, **TINY)
    return out


def copy_repo(root: Path, tiny_raw: Path, leave_out: tuple[str, ...] = ("data/raw/",), **params) -> Path:
    """A git + DVC copy of the repo in root (its files tracked or not ignored, but those whose path
    starts with one of `leave_out`), the tiny corpus as data/raw/ and `params` set, committed."""
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                           cwd=REPO, capture_output=True, check=True).stdout.decode().split("\0")
    for rel in filter(None, files):
        src = REPO / rel
        if src.is_file() and not rel.startswith(leave_out):
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, root / rel)
    shutil.copytree(tiny_raw, root / "data" / "raw")
    set_params(root, **params)
    for cmd in (["git", "init", "-q"], ["git", "add", "-A"],
                ["git", "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "init"]):
        subprocess.run(cmd, cwd=root, check=True, capture_output=True)
    return root


@pytest.fixture
def repo(tmp_path: Path, tiny_raw: Path) -> Path:
    """A git + DVC copy of the repo whose params point at the tiny corpus and a small model."""
    # the copy starts with no pipeline outputs: no metrics, plots or lock of the demo run,
    # and without the base model's pipeline and its 30 MB model (base/: no test runs it there);
    # no model logged to MLflow after each tiny training (seconds each); tests of it turn it on
    return copy_repo(tmp_path / "repo", tiny_raw, ("data/raw/", "metrics/", "plots/", "dvc.lock", "base/"),
                     **{"tokenizer.vocab_size": 512, "tracking.log_model": False})


# The tiny training of train_repo's copies (tests/test_train.py's real runs: 2 DDP processes, 300 steps)
TINY_TRAIN = {
    "seed": 7, "alpha": 0.5, "model.block_size": 32, "model.n_layer": 1, "model.n_head": 2,
    "model.n_embd": 32, "model.dropout": 0.1, "loss.rare_weight": 1.0, "rare.top_k": 40,
    "train.nproc": 2, "train.max_steps": 300, "train.batch_size": 4, "train.warmup_steps": 10,
    "train.log_every": 50, "train.eval_every": 150, "train.eval_batches": 2,
    "train.checkpoint_every": 50, "tracking.experiment": "test-train", "tracking.log_model": "auto",
}


def train_repo(root: Path, tiny_raw: Path) -> Path:
    """A git + DVC copy of the repo on the tiny corpus with TINY_TRAIN's params (what the `repo`
    fixture does, with the demo run's outputs kept and another training)."""
    return copy_repo(root, tiny_raw, **{"tokenizer.vocab_size": 512}, **TINY_TRAIN)


@pytest.fixture(scope="module")
def weights_repo(tmp_path_factory, tiny_raw) -> Path:
    """train_repo's tiny pipeline up to the weights stage (what training reads), once per module:
    tests train in it on one process, their outputs in their own tmp_path."""
    root = train_repo(tmp_path_factory.mktemp("weights") / "repo", tiny_raw)
    run(["dvc", "repro", "weights"], root, check=True)
    return root


def staged_folder(root: Path, tiny_raw: Path, stages: Iterable[str], **params) -> Path:
    """A folder with the repo's params.yaml on the tiny English corpus (`params` set, as
    set_params takes them) and `stages` run in it through their CLIs, in order."""
    shutil.copy(REPO / "params.yaml", root / "params.yaml")
    set_params(root, **{"corpus.path": str(tiny_raw / "demo_en.txt.gz"), **params})
    for name in stages:
        stage(name, root, check=True)
    return root


def tokenized_in(root: Path, corpus_path: Path, **params):
    """root/params.yaml (the repo's, with the corpus at `corpus_path` and `params` set), its corpus
    prepared and tokenized in process into root/data/; returns the TokenizedData."""
    from rarelm.artifacts.tokenized import TokenizedData
    from rarelm.files import write_json
    from rarelm.params import load_params
    from rarelm.prepare import corpus
    from rarelm.tokenize import tokenization

    shutil.copy(REPO / "params.yaml", root / "params.yaml")
    set_params(root, **{"corpus.path": str(corpus_path), **params})
    loaded = load_params(root / "params.yaml")
    for sub in ("data/prepared", "data/tokenized"):
        (root / sub).mkdir(parents=True)
    write_json(root / "data/prepared/stats.json", corpus.prepare(loaded.corpus, root / "data/prepared"))
    meta = tokenization.tokenize(loaded.tokenizer, root / "data/prepared", root / "data/tokenized")
    write_json(root / "data/tokenized/meta.json", meta)
    return TokenizedData.open(root / "data/tokenized")


@pytest.fixture(scope="module")
def eval_workspace(tmp_path_factory, tiny_raw) -> Path:
    """A folder with params.yaml, tokenized tiny corpus, synthetic rare files and a tiny GPT-2: what
    the evaluate stage reads (tests/test_evaluate.py, tests/test_knn.py), once per module."""
    import json

    import numpy as np
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    root = tmp_path_factory.mktemp("ws")
    data = tokenized_in(root, tiny_raw / "demo_en.txt.gz", **{
        "tokenizer.vocab_size": 300, "eval.max_terms": 40, "eval.batch_size": 8,
        "eval.diversity_prompts": 4, "eval.diversity_tokens": 8, "eval.insertion_prompts": 4,
        "eval.insertion_tokens": 8, "eval.context_tokens": 16})
    counts = np.bincount(data.tokens("train"), minlength=data.vocab_size)
    buckets = np.select([counts == 0, counts < 5, counts < 50], [3, 2, 1], 0).astype(np.int8)
    (root / "data/rare").mkdir()
    np.save(root / "data/rare/buckets.npy", buckets)
    np.save(root / "data/rare/counts.npy", counts.astype(np.int64))
    first_doc = json.loads((root / "data/prepared/test.jsonl").read_text().splitlines()[0])["text"]
    words = [w.strip(".,:") for w in first_doc.split()]
    with open(root / "data/rare/terms.jsonl", "w") as f:  # word pairs of the test split's first document
        for i, (a, b) in enumerate(dict.fromkeys(zip(words[:30:2], words[1:30:2], strict=True))):
            f.write(json.dumps({"term": f"{a} {b}", "source": "tfidf", "count": 2 ** i, "df": 1,
                                "idf": 1.0, "score": 1.0}) + "\n")
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=data.vocab_size, n_positions=64, n_embd=32, n_layer=1,
                                       n_head=2, bos_token_id=data.eot_id, eos_token_id=data.eot_id))
    model.save_pretrained(root / "models/model")
    for path in data.tokenizer_dir.iterdir():
        shutil.copy(path, root / "models/model")
    return root


@pytest.fixture(scope="module")
def generate_model_dir(tmp_path_factory) -> Path:
    """A tiny random GPT-2 with a real BPE tokenizer (trained on tests/helpers.py's TEXTS), saved as
    a Hugging Face folder (tests/test_generate.py, tests/test_knn.py), once per module."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    from rarelm.tokenize.tokenization import EOT, save_hf_tokenizer, train_bpe
    from tests.helpers import TEXTS

    out = tmp_path_factory.mktemp("model")
    tokenizer = train_bpe(iter(TEXTS), vocab_size=300, min_frequency=1)
    save_hf_tokenizer(tokenizer, out)
    eot = tokenizer.token_to_id(EOT)
    torch.manual_seed(0)  # large init: varied, non-repeating greedy output
    GPT2LMHeadModel(GPT2Config(vocab_size=tokenizer.get_vocab_size(), n_positions=64, n_embd=32, n_layer=2,
                               n_head=2, bos_token_id=eot, eos_token_id=eot,
                               initializer_range=0.5)).save_pretrained(out)
    return out
