"""Shared fixtures: a throw-away copy of the repo with a tiny corpus, and a CLI runner; how the
suite runs on pytest-xdist workers (`make test`: `pytest -n 2`)."""

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


@pytest.fixture
def repo(tmp_path: Path, tiny_raw: Path) -> Path:
    """A git + DVC copy of the repo whose params point at the tiny corpus and a small model."""
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                           cwd=REPO, capture_output=True, check=True).stdout.decode().split("\0")
    root = tmp_path / "repo"
    for rel in filter(None, files):
        src = REPO / rel
        # the copy starts with no pipeline outputs: no metrics, plots or lock of the demo run,
        # and without the base model's pipeline and its 30 MB model (base/: no test runs it there)
        if src.is_file() and not rel.startswith(("data/raw/", "metrics/", "plots/", "dvc.lock", "base/")):
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, root / rel)
    shutil.copytree(tiny_raw, root / "data" / "raw")
    # no model logged to MLflow after each tiny training (seconds each); tests of it turn it on
    set_params(root, **{"tokenizer.vocab_size": 512, "tracking.log_model": False})
    for cmd in (["git", "init", "-q"], ["git", "add", "-A"],
                ["git", "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "init"]):
        subprocess.run(cmd, cwd=root, check=True, capture_output=True)
    return root
