"""Faults and bad input: each test asserts that nothing is lost (docs/reliability.md lists them).

A full disk is simulated portably, without root or a tmpfs: the stage runs in a subprocess whose
RLIMIT_FSIZE is tiny and which ignores SIGXFSZ, so its writes fail with the kernel's own EFBIG
("File too large"), as they would fail with ENOSPC on a full disk.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest
import yaml

from rarelm.report import reprocheck
from tests.conftest import BIN, REPO, built_once, run, set_params, stage


def tree_digest(*paths: Path) -> dict[str, str]:
    """{file: sha256} of every file under the given files/folders (missing ones left out)."""
    out = {}
    for root in paths:
        files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
        for f in files:
            out[str(f)] = hashlib.sha256(f.read_bytes()).hexdigest()
    return out


def assert_one_line_error(result: subprocess.CompletedProcess, *needles: str) -> str:
    assert result.returncode != 0, result.stdout
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def run_with_file_size_limit(args: list[str], cwd: Path, limit_bytes: int,
                             env: dict | None = None) -> subprocess.CompletedProcess:
    def limit() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a failing write, not a killed process
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, limit_bytes))

    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "PYTHONDONTWRITEBYTECODE": "1",
           **(env or {})}
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, preexec_fn=limit,
                          timeout=300)


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if ".tmp-" in p.name or ".old-" in p.name)


@pytest.mark.parametrize("name", ["prepare", "tokenize"])
def test_full_disk_while_writing_outputs_keeps_previous_outputs(repo, name):
    stage("prepare", repo, check=True)
    if name == "tokenize":
        stage("tokenize", repo, check=True)
    outputs = {"prepare": [repo / "data/prepared", repo / "metrics/prepare.json"],
               "tokenize": [repo / "data/tokenized", repo / "metrics/tokenize.json"]}[name]
    before = tree_digest(*outputs)
    # params that would change every output (the split follows corpus.split_seed, not seed),
    # then a disk that fills up half-way
    set_params(repo, **{"corpus.split_seed": 7, "tokenizer.vocab_size": 600})
    result = run_with_file_size_limit([sys.executable, "-m", f"stages.{name}"], repo, 16 * 1024)
    assert_one_line_error(result, f"rarelm {name}: error: cannot write outputs", "File too large")
    assert result.returncode == 2
    assert tree_digest(*outputs) == before, "previous outputs changed"
    assert leftovers(repo / "data") == [] and leftovers(repo / "metrics") == []
    if name == "prepare":  # with space again, the same command succeeds
        stage(name, repo, check=True)
        assert tree_digest(*outputs) != before


def test_full_disk_at_tokenize_big_write_is_one_line(repo):
    """The file-size limit just above every tokenizer and offsets file, below train.tokens: the
    token array's write fails (numpy's tofile said so without an errno: a traceback, exit 1)."""
    stage("prepare", repo, check=True)
    stage("tokenize", repo, check=True)
    outputs = [repo / "data/tokenized", repo / "metrics/tokenize.json"]
    before = tree_digest(*outputs)
    sizes = {p.name: p.stat().st_size for p in (repo / "data/tokenized").rglob("*") if p.is_file()}
    small = max(size for name, size in sizes.items() if not name.endswith(".tokens"))
    assert small < sizes["train.tokens"], sizes
    result = run_with_file_size_limit([sys.executable, "-m", "stages.tokenize"], repo, small + 1)
    assert_one_line_error(result, "rarelm tokenize: error: cannot write outputs:", "File too large")
    assert result.returncode == 2
    assert tree_digest(*outputs) == before
    assert leftovers(repo / "data") == [] and leftovers(repo / "metrics") == []


def test_prepare_killed_mid_write_leaves_no_temporary_folder_after_the_next_run(repo, tmp_path):
    """SIGKILL cannot be cleaned up after: the next prepare removes the dead run's
    `.prepared.tmp-<pid>` (a running process's would stay)."""
    big = repo / "data/raw/big.txt.gz"  # the demo corpus 4 times (gzip members): a second or so
    big.write_bytes((REPO / "data/raw/demo_en.txt.gz").read_bytes() * 4)
    set_params(repo, **{"corpus.path": "data/raw/big.txt.gz"})
    proc = start([sys.executable, "-m", "stages.prepare"], repo, tmp_path / "prepare.log")
    tmp = repo / "data" / f".prepared.tmp-{proc.pid}"
    deadline = time.monotonic() + 120
    while not (tmp / "train.jsonl").exists():
        assert proc.poll() is None, (tmp_path / "prepare.log").read_text()
        assert time.monotonic() < deadline
        time.sleep(0.005)
    proc.kill()
    proc.wait()
    assert leftovers(repo / "data") == [tmp.name]
    stage("prepare", repo, check=True)
    assert leftovers(repo / "data") == [] and (repo / "data/prepared/train.jsonl").is_file()


# ------------------------------------------------------------------ the whole DAG, tiny
#
# One module-scoped run of the whole DAG, twice from scratch (the reproducibility check, with the
# MLflow server down in the second run), is the baseline every fault below is compared with: a
# faulted run must end byte-identical to it.

# block_size 64: evaluate needs room for a prompt plus twice the longest term (14 tokens here).
# A curve row every 4 steps, a checkpoint every 5: a run killed after a checkpoint between two
# rows must still log the rows of an uninterrupted run (the log window is in the checkpoint).
TINY_DAG = {"tokenizer.vocab_size": 512, "model.n_layer": 1, "model.n_head": 2, "model.n_embd": 32,
            "model.block_size": 64, "train.nproc": 2, "train.max_steps": 40, "train.batch_size": 4,
            "train.log_every": 4, "train.eval_every": 20, "train.eval_batches": 2,
            "train.checkpoint_every": 5, "train.warmup_steps": 2, "eval.batch_size": 8,
            "eval.max_terms": 20, "eval.diversity_prompts": 4, "eval.diversity_tokens": 8,
            "eval.insertion_prompts": 4, "eval.insertion_tokens": 8, "tracking.log_model": False,
            "tracking.required": False}
EVAL_KEYS = ("ppl", "ppl_frequent", "ppl_medium", "ppl_rare", "rare_token_acc", "rare_token_recall_at_5",
             "term_exact_match", "term_first_token_acc", "n_eval_tokens", "n_eval_terms")


def copy_repo(root: Path, tiny_raw: Path) -> Path:
    """As conftest's `repo` fixture (which is function-scoped): the repo, the tiny corpus, git."""
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                           cwd=REPO, capture_output=True, check=True).stdout.decode().split("\0")
    for rel in filter(None, files):
        if (REPO / rel).is_file() and not rel.startswith(("data/raw/", "metrics/", "plots/", "dvc.lock")):
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / rel, root / rel)
    shutil.copytree(tiny_raw, root / "data" / "raw")
    params = yaml.safe_load((root / "params.yaml").read_text())
    set_params(root, **{k: v for k, v in TINY_DAG.items()
                        if k.split(".")[1] in (params.get(k.split(".")[0]) or {})})
    for cmd in (["git", "init", "-q"], ["git", "add", "-A"],
                ["git", "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "init"]):
        subprocess.run(cmd, cwd=root, check=True, capture_output=True)
    return root


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def dag(tmp_path_factory, tiny_raw):
    """The whole DAG run twice from scratch; in run 2 the MLflow server is down. Built once for
    all xdist workers: the tests below only read it (`clone` copies it)."""
    return built_once(tmp_path_factory, "dag", lambda folder: _dag(folder, tiny_raw))


def _dag(folder: Path, tiny_raw: Path) -> SimpleNamespace:
    root = copy_repo(folder / "repo", tiny_raw)
    down = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    log: list[str] = []
    results: list[subprocess.CompletedProcess] = []
    try:
        hashes, error = reprocheck.reproduce(
            root, runs=2, log=log.append, results=results,
            run_env=lambda i: {"MLFLOW_TRACKING_URI": down} if i == 1 else {}), None
    except reprocheck.ReproError as exc:
        hashes, error = {}, exc
    return SimpleNamespace(root=root, hashes=hashes, error=error, log=log, results=results, down=down)


def dag_stages(root: Path) -> dict:
    return yaml.safe_load((root / "dvc.yaml").read_text())["stages"]


def test_dag_twice_from_scratch_gives_byte_identical_outputs(dag):
    """`dvc repro --force` twice, training checkpoints removed: identical hashes in dvc.lock."""
    assert dag.error is None, str(dag.error)
    stages = dag_stages(dag.root)
    assert {"prepare", "tokenize", "rare_terms", "weights", "train", "evaluate"} <= set(stages)
    outs = {o if isinstance(o, str) else next(iter(o)) for s in stages.values() for o in s.get("outs", [])}
    assert outs <= set(dag.hashes)
    for result in dag.results:  # every stage really ran, twice
        for name in stages:
            assert f"Running stage '{name}'" in result.stdout, name
    assert dag.log[-1].endswith("byte-identical across 2 runs")


def test_mlflow_server_down_dag_completes_with_complete_metrics_and_one_warning(dag):
    assert len(dag.results) == 2, str(dag.error)
    up, down = dag.results

    def tracking_warnings(result) -> list[str]:
        return [line for line in (result.stdout + result.stderr).splitlines()
                if ": warning:" in line and "MLflow" in line]

    assert tracking_warnings(up) == []
    warnings = tracking_warnings(down)
    stages = [line.split(":")[0] for line in warnings]
    assert stages == ["rarelm train", "rarelm evaluate"], warnings  # one line per tracking stage
    assert f"MLflow tracking store {dag.down} is not reachable" in warnings[0]
    metrics = json.loads((dag.root / "metrics/eval.json").read_text())
    assert all(isinstance(metrics.get(k), (int, float)) for k in EVAL_KEYS), metrics
    train = json.loads((dag.root / "metrics/train.json").read_text())
    assert train["steps"] == TINY_DAG["train.max_steps"] and train["loss"] > 0
    # and the same outputs as run 1, which tracked into the embedded store
    assert dag.error is None and (dag.root / "mlflow.db").is_file()


def clone(dag, dest: Path) -> Path:
    """A copy of the finished DAG's workspace without DVC's cache, so DVC cannot restore
    `train`'s outputs from it and has to run the stage (as after a param change)."""
    if dag.error is not None:
        pytest.skip(f"the baseline DAG failed: {dag.error}")
    shutil.copytree(dag.root, dest, symlinks=True)
    for rel in (".dvc/cache", ".dvc/tmp", ".cache"):
        shutil.rmtree(dest / rel, ignore_errors=True)
    return dest


def start(args: list[str], cwd: Path, out: Path, env: dict | None = None) -> subprocess.Popen:
    full = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "PYTHONUNBUFFERED": "1",
            **(env or {})}
    with open(out, "w") as f:  # a file, not a pipe: nobody blocks on a full pipe
        return subprocess.Popen(args, cwd=cwd, env=full, stdout=f, stderr=subprocess.STDOUT,
                                start_new_session=True)


def checkpoints(root: Path) -> list[Path]:
    return sorted(root.glob(".cache/train/*/step-*"))


def wait_for_checkpoints(root: Path, proc: subprocess.Popen, n: int, log: Path,
                         timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while len(checkpoints(root)) < n:
        assert proc.poll() is None, f"exited {proc.returncode} before checkpoint {n}:\n{log.read_text()}"
        assert time.monotonic() < deadline, f"no checkpoint {n} after {timeout} s"
        time.sleep(0.01)


def kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL the process and every descendant (torchrun's workers run in their own sessions)."""
    parent = psutil.Process(proc.pid)
    for p in [parent, *parent.children(recursive=True)]:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    proc.wait()


def assert_same_training_result(root: Path, baseline: Path) -> None:
    """Model bytes, train metrics and curves equal to the uninterrupted run (wall clock aside)."""
    for rel in ("models/model/model.safetensors", "models/model/config.json"):
        assert (root / rel).read_bytes() == (baseline / rel).read_bytes(), rel
    same = reprocheck.without_wall_clock
    for rel in ("metrics/train.json", "plots/train.csv"):
        assert same(root / rel) == same(baseline / rel), rel


@pytest.fixture(scope="session")
def killed(dag, tmp_path_factory):
    """`dvc repro` of train SIGKILLed (dvc, torchrun and both workers) after two checkpoints
    (built once, as `dag`; the tests copy it)."""
    return built_once(tmp_path_factory, "killed", lambda folder: _killed(dag, folder))


def _killed(dag, folder: Path) -> Path:
    root = clone(dag, folder / "repo")
    log = root.parent / "killed.log"
    proc = start(["dvc", "repro", "--force", "--single-item", "train"], root, log)
    try:
        wait_for_checkpoints(root, proc, 2, log)
    finally:
        kill_tree(proc)
    assert proc.returncode == -signal.SIGKILL
    assert not (root / "models/model").exists(), "DVC removes the outputs before it runs a stage"
    return root


def test_training_sigkilled_then_dvc_repro_resumes_bit_identical(dag, killed, tmp_path):
    root = tmp_path / "repo"
    shutil.copytree(killed, root, symlinks=True)
    last = checkpoints(root)[-1]
    result = run(["dvc", "repro", "train"], root, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    output = result.stdout + result.stderr  # log lines go to stderr, the summary to stdout
    assert f"train: resuming from {last.relative_to(root)} (step {int(last.name[5:])})" in output, \
        output[-3000:]
    assert_same_training_result(root, dag.root)
    assert checkpoints(root) == []  # a finished run clears its checkpoints


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_training_sigkilled_resumes_bit_identical_in_each_precision(dag, tmp_path, precision):
    """Determinism and bit-exact resume hold per precision, on one machine: the train stage with
    `train.precision` pinned (bf16 autocast is emulated where the CPU has no native bf16),
    SIGKILLed with its workers after two checkpoints and started again, ends byte-identical to
    an uninterrupted run of the same precision. (Across precisions results differ by bf16
    rounding; across CPU kinds see README, "Precision".) The precision that `auto` picks is
    covered by the resume test through `dvc repro` above, so it is skipped here."""
    import torch

    from rarelm.train.precision import pick_precision

    cpu = torch.device("cpu")
    if pick_precision("auto", cpu) == pick_precision(precision, cpu):
        pytest.skip(f"auto is {precision} on this CPU: "
                    "test_training_sigkilled_then_dvc_repro_resumes_bit_identical covers it")
    root = clone(dag, tmp_path / "repo")
    set_params(root, **{"train.precision": precision})
    outputs = ("models/model", "metrics/train.json", "plots/train.csv")
    for rel in outputs:  # the DAG's own outputs must not stand in for the resumed run's
        (shutil.rmtree if (root / rel).is_dir() else os.remove)(root / rel)
    train_stage = [sys.executable, "-m", "stages.train", "--no-progress"]
    baseline = tmp_path / "uninterrupted"
    shutil.copytree(root, baseline, symlinks=True)
    run(train_stage, baseline, check=True, timeout=900)
    log = tmp_path / "killed.log"
    proc = start(train_stage, root, log)
    try:
        wait_for_checkpoints(root, proc, 2, log)
    finally:
        kill_tree(proc)
    assert proc.returncode == -signal.SIGKILL
    assert not any((root / rel).exists() for rel in outputs)
    last = checkpoints(root)[-1]
    result = run(train_stage, root, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert f"resuming from {last.relative_to(root)} (step {int(last.name[5:])})" in result.stderr
    assert_same_training_result(root, baseline)
    assert checkpoints(root) == []


def test_corrupt_checkpoint_is_skipped_with_a_warning(dag, killed, tmp_path):
    root = tmp_path / "repo"
    shutil.copytree(killed, root, symlinks=True)
    older, newest = checkpoints(root)[-2:]
    shard = newest / "dcp" / "__0_0.distcp"  # rank 0's part of the model and optimizer
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])  # truncated
    result = run(["dvc", "repro", "train"], root, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    output = result.stdout + result.stderr
    warnings = [line for line in output.splitlines() if "warning: skipping corrupt checkpoint" in line]
    assert len(warnings) == 1 and newest.name in warnings[0], output[-3000:]
    assert f"train: resuming from {older.relative_to(root)} (step {int(older.name[5:])})" in output
    assert_same_training_result(root, dag.root)


def test_planted_checkpoint_does_not_run_and_is_skipped_with_a_warning(dag, killed, tmp_path):
    """The newest checkpoint's dcp/.metadata replaced by a pickle that would create a marker file,
    its sha256 in the manifest recomputed (as anyone who can write the cache folder could): the
    manifest's HMAC does not match, so nothing of it is read; training resumes from the one
    before it and ends byte-identical."""
    import pickle

    root = tmp_path / "repo"
    shutil.copytree(killed, root, symlinks=True)
    older, newest = checkpoints(root)[-2:]
    marker = tmp_path / "planted-code-ran"
    metadata = newest / "dcp" / ".metadata"
    metadata.write_bytes(pickle.dumps(_Planted(marker)))
    manifest = json.loads((newest / "manifest.json").read_text())
    manifest["sha256"]["dcp/.metadata"] = hashlib.sha256(metadata.read_bytes()).hexdigest()
    (newest / "manifest.json").write_text(json.dumps(manifest))
    result = run(["dvc", "repro", "train"], root, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert not marker.exists(), "the planted pickle ran"
    output = result.stdout + result.stderr
    warnings = [line for line in output.splitlines() if "warning: skipping corrupt checkpoint" in line]
    assert len(warnings) == 1 and newest.name in warnings[0], output[-3000:]
    assert "signature does not match" in warnings[0]
    assert f"train: resuming from {older.relative_to(root)} (step {int(older.name[5:])})" in output
    assert_same_training_result(root, dag.root)


class _Planted:
    """Unpickling it creates the file `marker` (it stands for any command)."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


@pytest.fixture(scope="session")
def fsdp(dag, tmp_path_factory):
    """train.strategy: fsdp on the DAG's params: `dvc repro train` uninterrupted, and the same
    SIGKILLed (dvc, torchrun, both workers) after two sharded checkpoints (built once, as `dag`)."""
    return built_once(tmp_path_factory, "fsdp", lambda folder: _fsdp(dag, folder))


def _fsdp(dag, folder: Path) -> SimpleNamespace:
    whole = clone(dag, folder / "whole")
    set_params(whole, **{"train.strategy": "fsdp"})
    killed = folder / "killed"
    shutil.copytree(whole, killed, symlinks=True)
    run(["dvc", "repro", "train"], whole, check=True, timeout=900)
    log = folder / "killed.log"
    proc = start(["dvc", "repro", "train"], killed, log)
    try:
        wait_for_checkpoints(killed, proc, 2, log)
    finally:
        kill_tree(proc)
    return SimpleNamespace(whole=whole, killed=killed)


def test_fsdp_training_sigkilled_then_dvc_repro_resumes_bit_identical(fsdp, tmp_path):
    root = tmp_path / "repo"
    shutil.copytree(fsdp.killed, root, symlinks=True)
    last = checkpoints(root)[-1]
    shards = sorted(p.name for p in (last / "dcp").iterdir())
    assert shards == [".metadata", "__0_0.distcp", "__1_0.distcp"]  # each rank wrote its own
    result = run(["dvc", "repro", "train"], root, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert f"train: resuming from {last.relative_to(root)} (step {int(last.name[5:])})" in result.stderr
    assert_same_training_result(root, fsdp.whole)
    assert checkpoints(root) == []


def test_fsdp_checkpoint_resumes_at_another_world_size(fsdp, tmp_path):
    """Written by 2 ranks, resumed by 3: DCP reshards, a warning says it is not bit-identical."""
    root = tmp_path / "repo"
    shutil.copytree(fsdp.killed, root, symlinks=True)
    last = checkpoints(root)[-1]
    set_params(root, **{"train.nproc": 3})
    result = run([sys.executable, "-m", "stages.train", "--no-progress"], root, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    warnings = [line for line in result.stderr.splitlines() if ": warning:" in line]
    assert warnings == ["rarelm train: warning: resuming a checkpoint written by 2 processes with 3: "
                        "the model and optimizer are resharded exactly, but the sample order and "
                        "random state are not, so the result is not bit-identical to an "
                        "uninterrupted run"]
    assert f"train: resuming from {last.relative_to(root)} (step {int(last.name[5:])})" in result.stderr
    resumed = json.loads((root / "metrics/train.json").read_text())
    whole = json.loads((fsdp.whole / "metrics/train.json").read_text())
    assert resumed["steps"] == whole["steps"] and resumed["parameters"] == whole["parameters"]
    step, per_rank = int(last.name[5:]), 4 * 64  # batch_size x block_size tokens per rank and step
    assert resumed["tokens"] == step * 2 * per_rank + (40 - step) * 3 * per_rank
    assert abs(resumed["val_ce"] - whole["val_ce"]) < 0.1 * whole["val_ce"]  # the same run, nearly
    # 3 ranks hold a third each (rounded up per tensor) instead of a half
    assert resumed["state_bytes_per_rank"] < 0.75 * whole["state_bytes_per_rank"]


def test_one_ddp_worker_killed_torchrun_restarts_and_resumes(dag, tmp_path):
    root = clone(dag, tmp_path / "repo")
    set_params(root, **{"train.max_restarts": 1})
    log = tmp_path / "train.log"
    proc = start([sys.executable, "-m", "stages.train", "--no-progress"], root, log)
    try:
        wait_for_checkpoints(root, proc, 1, log)
        workers = [p for p in psutil.Process(proc.pid).children(recursive=True)
                   if "stages.train" in " ".join(p.cmdline()) and p.environ().get("LOCAL_RANK") == "1"]
        assert len(workers) == 1, workers
        workers[0].kill()
        try:
            assert proc.wait(timeout=300) == 0, log.read_text()[-3000:]
        except subprocess.TimeoutExpired:
            pytest.fail("the restarted workers hung in gloo's rendezvous on the previous attempt's "
                        "keys (pytorch#135712); torchrun needs TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1")
    finally:
        if proc.poll() is None:
            kill_tree(proc)
    output = log.read_text()
    assert "train: resuming from" in output, output[-3000:]
    assert_same_training_result(root, dag.root)


def test_full_disk_while_training_writes_a_checkpoint(dag, tmp_path):
    """The checkpoint (weights + optimizer state) does not fit: one line, exit 2, nothing left."""
    root = clone(dag, tmp_path / "repo")
    outs = [root / "models/model", root / "metrics/train.json", root / "plots/train.csv"]
    before = tree_digest(*outs)
    limit = int((root / "models/model/model.safetensors").stat().st_size * 1.5)  # weights fit, state not
    down = {"MLFLOW_TRACKING_URI": f"http://127.0.0.1:{free_port()}"}  # no SQLite store to write
    result = run_with_file_size_limit([sys.executable, "-m", "stages.train", "--no-progress"], root,
                                      limit, env=down)
    errors = [line for line in result.stderr.splitlines() if ": error:" in line]
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert len(errors) == 1, result.stderr[-3000:]  # said once, by rank 0
    assert re.fullmatch(r"rarelm train: error: cannot write outputs: (File too large|a write was cut "
                        r"short) \(disk full or file size limit\); no half-written output is left",
                        errors[0]), errors
    assert tree_digest(*outs) == before
    assert [p.name for p in root.glob(".cache/train/*/*")] == []  # no partial checkpoint kept
    assert leftovers(root / "models") == []


@pytest.mark.parametrize(("name", "split"),
                         [("rare_terms", "train"), ("train", "train"), ("evaluate", "test")])
def test_corrupted_token_array_is_a_one_line_error_and_outputs_stay(dag, tmp_path, name, split):
    root = clone(dag, tmp_path / "repo")
    tokens = root / f"data/tokenized/{split}.tokens"
    with open(tokens, "r+b") as f:
        f.truncate(tokens.stat().st_size - 3)  # not even a whole number of tokens
    outs = [root / "data/rare", root / "models/model", root / "metrics", root / "plots"]
    before = tree_digest(*outs)
    result = stage(name, root)
    assert_one_line_error(result, f"rarelm {name}: error:", f"{split}.tokens", "re-run the tokenize stage")
    assert result.returncode == 2
    assert tree_digest(*outs) == before


BAD_PARAMS = {  # a bad params.yaml that a stage after prepare used to refuse, and the check's line
    "corpus-path": ({"corpus.path": "data/raw/missing.txt.gz"},
                    "corpus.path: no such file or folder: data/raw/missing.txt.gz"),
    "block-size-over-the-models-positions": (
        {"model.name_or_path": "models/model", "tokenizer.name_or_path": "models/model",
         "model.block_size": 512},
        "params: model.block_size = 512 is not allowed (must be <= 64, the positions models/model was "
        "trained with)"),
    "hub-id-not-cached": (
        {"model.name_or_path": "rarelm-test/not-cached", "tokenizer.name_or_path": "rarelm-test/not-cached"},
        "tokenizer.name_or_path: no such folder: rarelm-test/not-cached, and no hub model"),
    "eval-block-size": ({"eval.block_size": 128},
                        "params: eval.block_size = 128 is not allowed (must be <= the model's context "
                        "length 64)"),
    "fsdp": ({"train.strategy": "fsdp", "train.nproc": 1},
             "params: train.strategy = 'fsdp' is not allowed with 1 process"),
}


@pytest.mark.parametrize(("overrides", "message"), BAD_PARAMS.values(), ids=BAD_PARAMS.keys())
def test_a_bad_params_yaml_stops_dvc_repro_at_check_and_deletes_nothing(dag, tmp_path, overrides, message):
    """Issue 57: DVC deletes a stage's outputs before running it, so train refusing model.block_size
    lost models/model (and a wrong corpus.path was DVC's own [Errno 2]). The check stage runs first:
    `dvc repro` ends there with our line and DVC's, and every output and the lock stay as they were."""
    root = clone(dag, tmp_path / "repo")
    kept = [root / "data", root / "models", root / "metrics", root / "plots", root / "dvc.lock"]
    before = tree_digest(*kept)
    assert (root / "models/model/model.safetensors").is_file()
    set_params(root, **overrides)
    result = run(["dvc", "repro"], root, env={"HF_HUB_CACHE": str(tmp_path / "empty-hub-cache")},
                 timeout=300)
    assert result.returncode != 0
    assert re.findall(r"Running stage '(\w+)'", result.stdout) == ["check"], result.stdout
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert "Traceback" not in result.stderr and len(lines) == 2, result.stderr
    assert lines[0].startswith("rarelm check: error: ") and message in lines[0], lines[0]
    assert lines[1] == ("ERROR: failed to reproduce 'check': failed to run: python -m stages.check, "
                        "exited with 2")
    assert tree_digest(*kept) == before


@pytest.mark.parametrize("uri", ["nosuchscheme://nowhere", "sqlite:////proc/no/such/dir/mlflow.db",
                                 "http://[not-a-host"])
def test_bad_tracking_uri_gives_one_warning_and_an_inert_run(uri, monkeypatch, capsys, tmp_path):
    """A malformed or impossible MLFLOW_TRACKING_URI: the stage goes on, nothing is logged or saved.
    (A server that is down: test_mlflow_server_down_...; train and evaluate on their own:
    tests/test_train.py and tests/test_evaluate.py.)"""
    from rarelm.params import Params, TrackingParams
    from rarelm.tracking.run import start_run

    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    run = start_run(Params(tracking=TrackingParams(required=False)), stage="train")
    run.log_metrics({"train/loss": 1.0}, step=1)
    run.save(tmp_path / "mlflow_run.json")
    run.finish()
    assert not run.active and not (tmp_path / "mlflow_run.json").exists()
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"rarelm train: warning: MLflow tracking store {uri} ")
    assert lines[0].endswith("going on without tracking")


def test_reliability_doc_names_only_tests_that_exist():
    """docs/reliability.md cites `tests/<file>.py::<test>`: every one of them must exist."""
    import re

    doc = (REPO / "docs/reliability.md").read_text()
    cited = re.findall(r"`(tests/test_\w+\.py)::(test_\w+)", doc)
    # the short form after a full one: `tests/x.py::test_a`, `::test_b`
    follow = r"`(tests/test_\w+\.py)::test_\w+[^`]*`((?:, `::test_\w+`)+)"
    cited += [(path, name) for path, names in re.findall(follow, doc)
              for name in re.findall(r"::(test_\w+)", names)]
    assert len(cited) > 20
    for path, name in cited:
        assert re.search(rf"^def {name}\(", (REPO / path).read_text(), re.M), f"{path}::{name}"


def readme_commands_after_make_repro() -> list[str]:
    """The commands README's "Two commands" section shows after `source .venv/bin/activate`."""
    section = (REPO / "README.md").read_text().split("## Two commands", 1)[1].split("\n## ", 1)[0]
    shown = [line[4:].split("  #")[0].strip() for line in section.splitlines() if line.startswith("    ")]
    return shown[shown.index("source .venv/bin/activate") + 1:]


def venv_as_make_builds_it(root: Path) -> Path:
    """root/.venv as `make` leaves it, without a download: a bare venv that borrows this
    interpreter's packages, with the console scripts the README calls and make's markers saying
    the packages are installed. Its PATH hook is left to the Makefile's own rule."""
    import sysconfig

    venv = root / ".venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    purelib = subprocess.run([venv / "bin/python", "-c",
                              "import sysconfig; print(sysconfig.get_path('purelib'))"],
                             capture_output=True, text=True, check=True).stdout.strip()
    borrowed = sysconfig.get_path("purelib")
    Path(purelib, "borrowed.pth").write_text(f"import site; site.addsitedir({borrowed!r})\n")
    for name in ("dvc", "rarelm"):
        body = (BIN / name).read_text().split("\n", 1)[1]
        (venv / "bin" / name).write_text(f"#!{venv}/bin/python\n{body}")
        (venv / "bin" / name).chmod(0o755)
    for marker in (".installed", ".installed-dev"):
        (venv / marker).touch()
    return venv


def test_readme_commands_after_make_repro_with_and_without_activation(dag, tmp_path):
    """A fresh clone after `make repro` (HEAD holds the run), in a shell whose PATH has no venv:
    every README command after it works as written inside `source .venv/bin/activate`, and from
    `.venv/bin/` without activation, where DVC's stages must still run the venv's python."""
    if dag.error is not None:
        pytest.skip(f"the baseline DAG failed: {dag.error}")
    root = tmp_path / "repo"
    shutil.copytree(dag.root, root, symlinks=True)
    venv = venv_as_make_builds_it(root)
    bare = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
    bare["PATH"] = "/usr/local/bin:/usr/bin:/bin"

    def sh(command: str, timeout: float = 600) -> subprocess.CompletedProcess:
        result = subprocess.run(["bash", "-c", command], cwd=root, env=bare, capture_output=True,
                                text=True, timeout=timeout)
        assert result.returncode == 0, f"{command}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
        return result

    assert "Data and pipelines are up to date" in sh("make repro").stdout
    assert (venv / ".path-hook").is_file()  # the Makefile's rule installed the PATH hook
    assert sh(".venv/bin/python -c 'import shutil; print(shutil.which(\"python\"))'").stdout.strip() \
        == str(venv / "bin/python")
    for cmd in (["git", "add", "-A"],
                ["git", "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "run"]):
        subprocess.run(cmd, cwd=root, check=True, capture_output=True)

    commands = readme_commands_after_make_repro()
    assert commands[0] == "dvc exp run -S alpha=0.7" and "rarelm --version" in commands
    for command in commands:  # not activated: called from .venv/bin/ (make targets need no venv)
        result = sh(command if command.startswith("make ") else f".venv/bin/{command}")
        if command.startswith("dvc exp run"):
            for name in ("weights", "train", "evaluate"):
                assert f"Running stage '{name}'" in result.stdout, result.stdout[-3000:]
    for command in commands:  # activated, as written
        sh(f"source .venv/bin/activate && {command}")
    assert (root / "dvc_plots/index.html").is_file()
    # an evaluate-only variant of HEAD's run (the workspace now holds the alpha=0.7 experiment's):
    # DVC's run cache restores HEAD's trained model (train's uncached curves are a plot, not an
    # out, so DVC saves the stage's run cache) and only evaluate runs
    alpha = yaml.safe_load(sh("git show HEAD:params.yaml").stdout)["alpha"]
    assert alpha != 0.7
    variant = sh(f".venv/bin/dvc exp run --temp -S alpha={alpha} -S eval.logit_adjust_tau=0.5").stdout
    assert "Stage 'train' is cached - skipping run" in variant, variant[-3000:]
    assert "Running stage 'evaluate'" in variant and "Running stage 'train'" not in variant

    # `dvc plots diff`: the experiment beside HEAD, train loss, val CE and val rare CE in one plot
    diff = json.loads(sh(".venv/bin/dvc plots diff --json --targets training_loss").stdout)
    plot = diff["data"]["training_loss"][0]
    assert sorted(plot["revisions"]) == ["HEAD", "workspace"]
    values = plot["content"]["data"]["values"]
    drawn = {(v["rev"], v["field"]) for v in values if v["dvc_inferred_y_value"] != ""}
    assert drawn == {(rev, f) for rev in ("HEAD", "workspace") for f in ("loss", "val_ce", "val_rare_ce")}
    # the empty val_* cells of steps without an evaluation are left out, not drawn as 0
    assert {"filter": {"not": {"field": "dvc_inferred_y_value", "equal": ""}}} in plot["content"]["transform"]


def test_a_copied_checkout_never_writes_into_the_original(dag, tmp_path):
    """Issue 24.5: MLflow records artifact locations as absolute paths, and the run file named the
    store by its absolute path: a copy of the checkout (mlflow.db and mlruns/ included) logged
    into the original's store and wrote its artifacts under the original's mlruns/. Now the store
    follows its folder and the run file names the repo's store relatively."""
    import mlflow

    if dag.error is not None:
        pytest.skip(f"the baseline DAG failed: {dag.error}")
    root = tmp_path / "copy"
    shutil.copytree(dag.root, root, symlinks=True)

    def files(folder: Path) -> dict[str, tuple[int, int]]:
        return {str(p): (p.stat().st_mtime_ns, p.stat().st_size) for p in folder.rglob("*") if p.is_file()}

    before = files(dag.root)
    result = run(["dvc", "repro", "--force", "--single-item", "evaluate"], root, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert files(dag.root) == before  # not a byte, not a new file under the original
    client = mlflow.MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("rarelm")
    assert experiment.artifact_location == f"{root}/mlruns/rarelm"
    (newest, *_) = client.search_runs([experiment.experiment_id], order_by=["attributes.start_time DESC"])
    assert "evaluate" in newest.data.tags["stages"] and "summary/ppl" in newest.data.metrics
    assert newest.info.artifact_uri.startswith(f"{root}/mlruns/rarelm/")
    assert {a.path for a in client.list_artifacts(newest.info.run_id, "eval")} >= {"eval/eval.json"}


def test_sigterm_to_dvc_repro_ends_the_running_stage_too(dag, tmp_path):
    """Issue 25.6: DVC has no SIGTERM handler and runs a stage as `$SHELL -c <cmd>`: `kill <dvc pid>`
    ended dvc alone, and the orphaned train stage went on to write models/model and finish its
    MLflow run (re-run: a duplicate). Now the stage follows its parent (PR_SET_PDEATHSIG): the train
    launcher stops torchrun's workers, nothing is written, the run ends FAILED."""
    import sqlite3

    root = clone(dag, tmp_path / "repo")
    log = tmp_path / "repro.log"
    proc = start(["dvc", "repro", "--force", "--single-item", "train"], root, log)
    tree: list[psutil.Process] = []
    try:
        wait_for_checkpoints(root, proc, 1, log)
        tree = psutil.Process(proc.pid).children(recursive=True)
        stage = [p for p in tree if p.name() not in ("sh", "dash", "bash")]  # $SHELL may stay between
        assert sum("stages.train" in " ".join(p.cmdline()) for p in stage) == 3  # launcher + 2 workers
        proc.send_signal(signal.SIGTERM)  # dvc alone, as `kill <pid>` does
        assert proc.wait(timeout=60) == -signal.SIGTERM
        _, alive = psutil.wait_procs(tree, timeout=120)
        assert alive == [], [p.cmdline() for p in alive]
    finally:
        for p in [*tree, *([psutil.Process(proc.pid)] if proc.poll() is None else [])]:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()
    assert not (root / "models/model").exists() and leftovers(root / "models") == []
    with contextlib.closing(sqlite3.connect(root / "mlflow.db")) as con:
        (status,) = con.execute("SELECT status FROM runs ORDER BY start_time DESC LIMIT 1").fetchone()
    assert status == "FAILED", log.read_text()[-3000:]
    assert checkpoints(root)  # and a later `dvc repro` resumes from them


SLOW_STAGE = """
import os, sys, time, yaml
runs = int(open(sys.argv[1]).read()) if os.path.exists(sys.argv[1]) else 0
open(sys.argv[1], "w").write(str(runs + 1))
while os.path.exists(sys.argv[2]):  # held: waits to be killed
    time.sleep(0.2)
open("out.txt", "w").write(str(yaml.safe_load(open("params.yaml"))["x"]))
"""


def test_a_queue_worker_killed_mid_experiment_is_noticed_and_its_experiment_runs_again(tmp_path, monkeypatch):
    """A queue worker that dies mid-experiment (a session's end, a reboot; on a busy machine DVC's
    own idle monitor stopped it with the last experiment just taken) leaves the experiment "Running"
    for ever, and a new worker never takes it up. The waiting `rarelm headline` marks it failed,
    queues it again and starts a worker; lost twice, it says so in one line, and run again, it
    marks it failed, queues it anew and ends."""
    import threading

    from rarelm.errors import RarelmError
    from rarelm.report.dvc_queue import existing, queue_state, run_batch

    root, runs, hold = tmp_path / "repo", tmp_path / "runs", tmp_path / "hold"
    root.mkdir()
    run(["git", "init", "-q"], root, check=True)
    run(["dvc", "init", "-q"], root, check=True)
    (root / "stage.py").write_text(SLOW_STAGE)
    (root / "params.yaml").write_text("x: 1\n")
    (root / "dvc.yaml").write_text(f"stages:\n  s:\n    cmd: python stage.py {runs} {hold}\n"
                                   "    deps: [stage.py]\n    params: [x]\n    outs: [out.txt]\n")
    (root / ".gitignore").write_text("/out.txt\n")
    run(["git", "add", "-A"], root, check=True)
    run(["git", "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "init"], root, check=True)
    monkeypatch.setenv("PATH", f"{BIN}{os.pathsep}{os.environ['PATH']}")  # the worker's dvc: the venv's

    def kill_worker_at_run(n: int) -> None:
        """Wait for the stage's n-th run, then kill the queue's worker and the experiment it runs."""
        for _ in range(240):
            if runs.exists() and runs.read_text() == str(n):
                break
            time.sleep(0.5)
        assert runs.exists() and runs.read_text() == str(n), (log, errors)
        roles = ("queue-worker", "exec-run", "stage.py")
        doomed = [p for p in psutil.process_iter(["cwd", "cmdline"])
                  if str(p.info["cwd"] or "").startswith(str(root))
                  and any(role in " ".join(p.info["cmdline"] or []) for role in roles)]
        assert len(doomed) >= 3, doomed
        for p in doomed:
            p.kill()

    def waiting_run(batch) -> threading.Thread:
        thread = threading.Thread(target=lambda: _catch(errors, run_batch, root, batch, log.append, 1))
        thread.start()
        return thread

    # killed once: the wait queues it again itself, and it ends
    log, errors = [], []
    hold.touch()
    waiting = waiting_run([("e1", ["x=2"])])
    kill_worker_at_run(1)
    for _ in range(240):  # the stage runs again: the experiment was queued anew, a worker took it
        if runs.read_text() == "2":
            break
        time.sleep(0.5)
    hold.unlink()
    waiting.join(timeout=180)
    assert not waiting.is_alive() and not errors, (log, errors)
    assert "e1 was left running by a worker that died: marked failed, queued again" in log
    assert "the queue's worker ended with experiments left: a new worker starts" in log
    assert "e1" in existing(root) and queue_state(root) == (set(), set())

    # killed twice: one line; run again, it marks it failed, queues it anew and ends
    log, errors = [], []
    hold.touch()
    waiting = waiting_run([("e2", ["x=3"])])
    kill_worker_at_run(3)
    kill_worker_at_run(4)
    waiting.join(timeout=180)
    assert not waiting.is_alive()
    assert [type(e) for e in errors] == [RarelmError] and "worker died running e2 twice" in str(errors[0])
    assert queue_state(root) == ({"e2"}, {"e2"}) and "e2" not in existing(root)
    hold.unlink()
    log = []
    assert run_batch(root, [("e2", ["x=3"])], log.append, poll=1) == 1
    assert "e2 was left running by a worker that died: marked failed, queued again" in log
    assert "e2" in existing(root) and queue_state(root) == (set(), set())
    shown = run(["dvc", "exp", "show", "--no-pager", "--csv"], root, check=True).stdout
    assert "e2" in shown and "Failed" in shown and "Success" in shown


FLAVOURED = """
import os
os.makedirs("d", exist_ok=True)
open("d/f1", "w").write(os.environ.get("FLAVOUR", "x"))  # a file another stage reads
open("d/f2", "w").write("same everywhere")
"""


def test_a_fresh_clone_caches_the_committed_listings_before_queueing(tmp_path, monkeypatch):
    """A queued experiment restoring a stage that reads files inside another stage's directory
    output (train: data/weights/*.npy) from the run cache loads the baseline lock's listing of that
    directory, and failed in a clone that never ran the pipeline. `run_batch` first runs the stages
    whose listing the cache lacks; where this machine makes other bits (FLAVOUR here, float rounding
    of another CPU kind there), the workspace's dvc.lock records its own, and the queue starts from it."""
    from rarelm.report.dvc_queue import _uncached_listings, cache_committed_inputs

    src, clone = tmp_path / "src", tmp_path / "clone"
    src.mkdir()
    (src / "make_d.py").write_text(FLAVOURED)
    (src / "dvc.yaml").write_text("stages:\n  a:\n    cmd: python make_d.py\n    deps: [make_d.py]\n"
                                  "    outs: [d]\n  b:\n    cmd: cp d/f1 b.txt\n    deps: [d/f1]\n"
                                  "    outs: [b.txt]\n")
    monkeypatch.setenv("PATH", f"{BIN}{os.pathsep}{os.environ['PATH']}")
    for cmd in (["git", "init", "-q"], ["dvc", "init", "-q"], ["dvc", "repro", "-q"], ["git", "add", "-A"],
                ["git", "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "init"]):
        run(cmd, src, check=True)
    run(["git", "clone", "-q", str(src), str(clone)], tmp_path, check=True)
    assert _uncached_listings(src) == [] and _uncached_listings(clone) == ["a"]  # b's files: no listing
    log: list[str] = []
    monkeypatch.setenv("FLAVOUR", "y")  # this machine's stage writes other bits into d/f1
    cache_committed_inputs(clone, log.append)
    assert log == ["DVC's cache lacks the listing of a's outputs in dvc.lock (a clone that never ran the "
                   "pipeline): dvc repro a"]
    assert _uncached_listings(clone) == []
    committed = yaml.safe_load((src / "dvc.lock").read_text())["stages"]["a"]["outs"][0]["md5"]
    now = yaml.safe_load((clone / "dvc.lock").read_text())["stages"]["a"]["outs"][0]["md5"]
    assert now != committed and (clone / "d/f1").read_text() == "y"
    cache_committed_inputs(clone, log.append)  # nothing missing now: nothing runs
    assert len(log) == 1


def test_a_busy_worker_that_misses_dvcs_status_question_is_not_taken_for_dead(tmp_path, monkeypatch):
    """`dvc queue status` counts workers by a celery broadcast that can time out on a busy machine:
    "0 active, 0 idle" while an experiment runs. Only when no `dvc exp queue-worker` process runs in
    the repo either is the running experiment lost; a worker counted idle is alive."""
    from rarelm.report import dvc_queue

    status = {"idle": 0}

    def dvc(args, repo, check=True):  # what `dvc queue status` prints
        return ("Task     Name  Created  Status\nabc1234  e1    10:00 AM Running\n"
                f"def5678  e2    10:01 AM Queued\n\nWorker status: 0 active, {status['idle']} idle\n")

    monkeypatch.setattr(dvc_queue, "_dvc", dvc)
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "exp", "queue-worker",
                               "dvc-exp-worker-1"], cwd=tmp_path)
    try:
        for _ in range(50):  # until its cmdline reads as the worker's
            if dvc_queue.worker_alive(tmp_path):
                break
            time.sleep(0.1)
        assert dvc_queue.queue_state(tmp_path) == ({"e1", "e2"}, set())
        assert not dvc_queue.worker_alive(tmp_path.parent / "elsewhere")
    finally:
        worker.kill()
        worker.wait()
    assert dvc_queue.queue_state(tmp_path) == ({"e1", "e2"}, {"e1"})
    status["idle"] = 1  # a worker counted idle (between two tasks) is alive
    assert dvc_queue.queue_state(tmp_path) == ({"e1", "e2"}, set())


def _catch(errors: list, fn, *args) -> None:
    try:
        fn(*args)
    except Exception as e:  # noqa: BLE001 - handed to the test's thread to assert on
        errors.append(e)


# ------------------------------------------- worker errors at the default train.nproc 2
#
# The tiny corpus through `weights` with model.block_size 32 (seconds), built once; a test copies
# nothing: it runs `python -m stages.train` there with its own params file and output paths.

@pytest.fixture(scope="session")
def upto_weights(tmp_path_factory, tiny_raw) -> Path:
    def build(folder: Path) -> Path:
        root = copy_repo(folder / "repo", tiny_raw)
        set_params(root, **{"model.block_size": 32, "train.max_steps": 2})
        run(["dvc", "repro", "weights"], root, check=True)
        return root

    return built_once(tmp_path_factory, "upto_weights", build)


def tiny_pretrained(root: Path, dest: Path, positions: int = 64) -> Path:
    """A 1-layer GPT-2 with the pipeline's tokenizer, saved as `save_pretrained` saves it."""
    from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel

    from rarelm.artifacts.tokenized import TokenizedData

    data = TokenizedData.open(root / "data/tokenized")
    GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=data.vocab_size,
                               n_positions=positions, bos_token_id=data.eot_id,
                               eos_token_id=data.eot_id)).save_pretrained(dest)
    AutoTokenizer.from_pretrained(data.tokenizer_dir).save_pretrained(dest)
    return dest


def train_stage(root: Path, tmp_path: Path, edit=None, **overrides) -> subprocess.CompletedProcess:
    """`python -m stages.train` on root's inputs with root's params + overrides, then `edit` of
    the file's text; outputs under tmp_path."""
    params = yaml.safe_load((root / "params.yaml").read_text())
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    set_params(tmp_path, **overrides)
    if edit:
        (tmp_path / "params.yaml").write_text(edit((tmp_path / "params.yaml").read_text()))
    return stage("train", root, "--params", str(tmp_path / "params.yaml"),
                 "--out", str(tmp_path / "model"), "--metrics", str(tmp_path / "train.json"),
                 "--plots", str(tmp_path / "train.csv"), "--cache", str(tmp_path / "cache"),
                 "--no-progress", env={"MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'm.db'}"})


def _fewer_positions(root: Path, folder: Path) -> None:
    tiny_pretrained(root, folder, positions=16)


def _other_tokenizer(root: Path, folder: Path) -> None:
    tiny_pretrained(root, folder)
    vocab = json.loads((folder / "tokenizer.json").read_text())
    first = next(iter(vocab["model"]["vocab"]))
    vocab["model"]["vocab"]["zz-not-ours"] = vocab["model"]["vocab"].pop(first)
    (folder / "tokenizer.json").write_text(json.dumps(vocab))


def _config_not_the_weights(root: Path, folder: Path) -> None:
    tiny_pretrained(root, folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "n_embd": 32}))


def _bin_weights_not_the_config(root: Path, folder: Path) -> None:
    """As above in a pytorch_model.bin, whose shapes only the load sees: refused on the workers."""
    import torch
    from safetensors.torch import load_file

    _config_not_the_weights(root, folder)
    torch.save(load_file(folder / "model.safetensors"), folder / "pytorch_model.bin")
    (folder / "model.safetensors").unlink()


@pytest.mark.parametrize(("make", "message"), [
    (_fewer_positions, "model.block_size = 32 is not allowed (must be <= 16, the positions "),
    (_other_tokenizer, "tokens) is not the one tokenize used ("),
    (_config_not_the_weights, "its weights do not match its config.json (transformer."),
    (_bin_weights_not_the_config, "cannot load the model weights (their shapes are not those of "
                                  "config.json)"),
], ids=["positions", "tokenizer", "config-safetensors", "config-bin-on-workers"])
def test_a_pretrained_model_every_rank_refuses_is_one_line_at_nproc_2(upto_weights, tmp_path, make,
                                                                    message):
    """Was: exit 2 and no message at all at nproc 2 (torchrun stopped rank 0 before it printed),
    or a 22-line transformers report. Now the launcher checks what every rank would refuse before
    torchrun starts, and prints the first rank's line of an error raised on the workers."""
    make(upto_weights, tmp_path / "pretrained")
    result = train_stage(upto_weights, tmp_path, **{"model.name_or_path": str(tmp_path / "pretrained"),
                                                   "train.nproc": 2})
    line = assert_one_line_error(result, "rarelm train: error: ", message)
    assert result.returncode == 2, line
    assert not any((tmp_path / name).exists() for name in ("model", "train.json", "train.csv"))
    assert not list(tmp_path.glob("cache/*/step-*"))


# ------------------------------------------------------ one reading of params.yaml

def test_max_steps_010_trains_the_10_steps_dvc_records(upto_weights, tmp_path):
    """`max_steps: 010` typed by hand: DVC records 10, and 10 steps are trained (were 8)."""
    result = train_stage(upto_weights, tmp_path, edit=lambda text: re.sub(
        r"max_steps: \d+", "max_steps: 010", text), **{"train.nproc": 1, "train.eval_every": 10})
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads((tmp_path / "train.json").read_text())["steps"] == 10  # PyYAML: 8


def test_a_second_dvc_exp_run_is_refused_before_it_changes_the_first(tmp_path, tiny_raw):
    """`dvc exp run -S seed=1340`, and while its stages run `dvc exp run -S seed=1341` in the same
    workspace. Was: the second wrote `seed: 1341` into params.yaml before DVC's lock refused it,
    and the first's train failed on the changed params (or, before the held-params check, trained
    with 1341). Now the first run's stages hold the workspace in DVC's experiments lock
    (rarelm/workspace.py): DVC refuses the second before it writes anything; the first ends as if
    alone."""
    from rarelm.workspace import HELD, locks_dir

    root = copy_repo(tmp_path / "repo", tiny_raw)
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}

    def readers() -> list[dict]:
        path = locks_dir(root) / "rwlock"
        return json.loads(path.read_text()).get("read", {}).get(HELD, []) if path.exists() else []

    with open(tmp_path / "first.log", "w") as log:
        first = subprocess.Popen(["dvc", "exp", "run", "-n", "first", "-S", "seed=1340"], cwd=root, env=env,
                                 stdout=log, stderr=subprocess.STDOUT)
        try:
            while "Running stage 'train'" not in (tmp_path / "first.log").read_text():  # seconds of it
                assert first.poll() is None, (tmp_path / "first.log").read_text()
                time.sleep(0.2)
            params = (root / "params.yaml").read_bytes()
            assert yaml.safe_load(params)["seed"] == 1340
            second = run(["dvc", "exp", "run", "-n", "second", "-S", "seed=1341"], root)
            assert (root / "params.yaml").read_bytes() == params
            assert first.wait(timeout=900) == 0, (tmp_path / "first.log").read_text()[-3000:]
        finally:
            kill_tree(first) if first.poll() is None else None
    assert second.returncode != 0
    assert "'workspace' is busy, it is being blocked by:" in second.stderr, second.stderr
    assert f"(PID {first.pid}): " in second.stderr
    shown = json.loads(run(["dvc", "exp", "show", "--json"], root, check=True).stdout)
    seeds = {rev.get("name"): rev["data"]["params"]["params.yaml"]["data"]["seed"]
             for row in shown for exp in row.get("experiments") or [] for rev in exp["revs"]}
    assert seeds == {"first": 1340}
    import sqlite3

    with contextlib.closing(sqlite3.connect(root / "mlflow.db")) as db:
        runs = db.execute("SELECT r.status, p.value FROM runs r JOIN params p ON p.run_uuid = r.run_uuid "
                          "WHERE p.key = 'seed'").fetchall()
    assert runs == [("FINISHED", "1340")]
    deadline = time.monotonic() + 60  # the entry's releaser follows dvc's end; a bound, no measurement
    while readers() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert readers() == []


def test_params_changed_while_training_saves_nothing_and_keeps_the_earlier_outputs(upto_weights, tmp_path):
    """A second `dvc exp run` in the workspace writes its `-S` value into params.yaml while the
    first one trains: the first run's outputs were saved under params it was not trained with.
    Now the stage refuses to put them in place (one line, exit 2): the earlier ones stay, and
    the checkpoints too, so the run resumes once the params are back."""
    params = yaml.safe_load((upto_weights / "params.yaml").read_text())
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    set_params(tmp_path, **{"train.nproc": 2, "train.max_steps": 120, "train.checkpoint_every": 20,
                            "train.eval_every": 120})
    earlier = {"model": tmp_path / "model", "metrics": tmp_path / "train.json",
               "plots": tmp_path / "train.csv"}
    earlier["model"].mkdir()
    (earlier["model"] / "config.json").write_text("{}")
    earlier["metrics"].write_text('{"steps": 1}\n')
    earlier["plots"].write_text("step\n1\n")
    before = tree_digest(*earlier.values())
    log = tmp_path / "train.log"
    proc = start([sys.executable, "-m", "stages.train", "--params", str(tmp_path / "params.yaml"),
                  "--out", str(earlier["model"]), "--metrics", str(earlier["metrics"]),
                  "--plots", str(earlier["plots"]), "--cache", str(tmp_path / "cache"), "--no-progress"],
                 upto_weights, log, env={"MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'm.db'}"})
    try:
        deadline = time.monotonic() + 300
        while not list(tmp_path.glob("cache/*/step-*")):
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.01)
        set_params(tmp_path, **{"train.lr": 0.01})  # what `dvc exp run -S train.lr=0.01` writes
        proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            kill_tree(proc)
    errors = [line for line in log.read_text().splitlines() if ": error:" in line or "Traceback" in line]
    assert errors == [f"rarelm train: error: params file {tmp_path / 'params.yaml'} changed while this "
                      "run was going (train.lr: 0.003 -> 0.01); its outputs are not saved and the "
                      "previous ones stay. To run experiments side by side use `dvc exp run --queue` "
                      "(then `dvc queue start`) or separate clones; put the params back and re-run "
                      "(training resumes from its last checkpoint)"], log.read_text()[-3000:]
    assert proc.returncode == 2
    assert tree_digest(*earlier.values()) == before
    assert list(tmp_path.glob("cache/*/step-*")) and leftovers(tmp_path) == []


# ------------------------------------------------- OS errors: one line naming the path and the fix

@contextlib.contextmanager
def unwritable(folder: Path):
    """A folder nobody can create files in: mode 0555 for a user, the immutable attribute for root
    (whom file modes do not stop)."""
    folder.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        folder.chmod(0o555)
    elif subprocess.run(["chattr", "+i", str(folder)], capture_output=True).returncode != 0:
        pytest.skip("root without chattr +i: no way to make a folder unwritable here")
    try:
        yield folder
    finally:
        if os.geteuid() != 0:
            folder.chmod(0o755)
        else:
            subprocess.run(["chattr", "-i", str(folder)], check=True)


def _prepare_os_error(tiny_raw: Path, tmp_path: Path, out: Path) -> subprocess.CompletedProcess:
    (tmp_path / "params.yaml").write_text(yaml.safe_dump({"corpus": {
        "path": str(tiny_raw / "demo_en.txt.gz"), "reference_glossary": ""}}))
    return stage("prepare", tmp_path, "--params", str(tmp_path / "params.yaml"), "--out", str(out),
                 "--metrics", str(tmp_path / "prepare.json"))


def test_an_unwritable_output_folder_is_one_line_naming_it(tiny_raw, tmp_path):
    """Was: 45 lines of traceback from prepare (157 from the two ranks of train)."""
    with unwritable(tmp_path / "data"):
        result = _prepare_os_error(tiny_raw, tmp_path, tmp_path / "data" / "prepared")
        assert list((tmp_path / "data").iterdir()) == []
    why = "Operation not permitted" if os.geteuid() == 0 else "Permission denied"
    # the output it names, not its temporary (`data/.prepared.tmp-<pid>`, as it did)
    assert_one_line_error(result, f"rarelm prepare: error: {tmp_path}/data/prepared: {why} (give "
                          "your user access to it")
    assert result.returncode == 2 and not (tmp_path / "prepare.json").exists()


def test_an_output_under_a_file_or_a_dangling_link_is_one_line_naming_it(tiny_raw, tmp_path):
    (tmp_path / "afile").write_text("x")
    result = _prepare_os_error(tiny_raw, tmp_path, tmp_path / "afile" / "prepared")
    assert_one_line_error(result, f"rarelm prepare: error: {tmp_path}/afile: File exists (something "
                          "other than a folder is where a folder is needed: move it aside)")
    assert result.returncode == 2 and (tmp_path / "afile").read_text() == "x"
    (tmp_path / "data").symlink_to(tmp_path / "gone")
    result = _prepare_os_error(tiny_raw, tmp_path, tmp_path / "data" / "prepared")
    assert_one_line_error(result, f"rarelm prepare: error: {tmp_path}/data is a symbolic link to "
                          f"{tmp_path}/gone, which does not exist: create its target or remove the link")
    assert result.returncode == 2 and not (tmp_path / "gone").exists()
    result = _prepare_os_error(tiny_raw, tmp_path, tmp_path / "afile" / "data" / "prepared")
    assert_one_line_error(result, f"rarelm prepare: error: {tmp_path}/afile/data: Not a directory (a part "
                          "of the path is a file where a folder is needed: move that file aside)")
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    result = _prepare_os_error(tiny_raw, tmp_path, tmp_path / "loop" / "prepared")
    assert_one_line_error(result, f"rarelm prepare: error: {tmp_path}/loop is a symbolic link that leads "
                          "back to itself (a loop): fix or remove the link")
    assert not (tmp_path / "prepare.json").exists()


@pytest.mark.parametrize("kind", ["fifo", "folder", "dangling-cache"])
def test_a_signing_key_that_is_no_file_or_a_dangling_cache_is_one_line(upto_weights, tmp_path, kind):
    """`.cache/train/.signing-key` a named pipe: training hung (the key was opened, blocking, before
    it was checked); a folder: an IsADirectoryError traceback; `.cache` a dangling link: a 64-line
    FileExistsError. Now one line from the launcher, before torchrun starts, nothing written."""
    cache = tmp_path / "cache"
    if kind == "dangling-cache":
        tmp_path.joinpath("dot-cache").symlink_to(tmp_path / "gone")
        cache = tmp_path / "dot-cache" / "train"
    else:
        cache.mkdir()
        os.mkfifo(cache / ".signing-key") if kind == "fifo" else (cache / ".signing-key").mkdir()
    params = yaml.safe_load((upto_weights / "params.yaml").read_text())
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    result = stage("train", upto_weights, "--params", str(tmp_path / "params.yaml"), "--cache", str(cache),
                   "--out", str(tmp_path / "model"), "--metrics", str(tmp_path / "train.json"),
                   "--plots", str(tmp_path / "train.csv"), "--no-progress", timeout=120,
                   env={"MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'm.db'}"})
    expected = {"fifo": f"checkpoint key {cache}/.signing-key: is a named pipe (FIFO), not a file; remove it",
                "folder": f"checkpoint key {cache}/.signing-key: is a folder, not a file; remove it",
                "dangling-cache": f"{tmp_path}/dot-cache is a symbolic link to {tmp_path}/gone, which "
                                  "does not exist: create its target or remove the link"}[kind]
    assert_one_line_error(result, f"rarelm train: error: {expected}")
    assert result.returncode == 2
    assert not any((tmp_path / name).exists() for name in ("model", "train.json", "train.csv", "gone"))


def test_out_of_memory_in_training_is_one_line_naming_the_batch_size(upto_weights, tmp_path):
    """`train.batch_size: 100000` under a 4 GB address-space limit, two ranks: was 581 lines."""
    params = yaml.safe_load((upto_weights / "params.yaml").read_text())
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    set_params(tmp_path, **{"train.batch_size": 100000, "train.nproc": 2})

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (4 * 2**30, 4 * 2**30))

    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
           "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'm.db'}"}
    result = subprocess.run(
        [sys.executable, "-m", "stages.train", "--params", str(tmp_path / "params.yaml"),
         "--cache", str(tmp_path / "cache"), "--out", str(tmp_path / "model"), "--metrics",
         str(tmp_path / "train.json"), "--plots", str(tmp_path / "train.csv"), "--no-progress"],
        cwd=upto_weights, env=env, capture_output=True, text=True, preexec_fn=limit, timeout=600)
    *before, error = result.stderr.strip().splitlines()
    # `auto` on a bf16 CPU runs out of memory in its precision probe, before the loop starts; on a
    # CPU without native bf16 (no precision probe) in the first step, after the start line, which
    # names the matmul route: its once-per-machine probe cached or not, it may itself run out first
    assert len(before) <= 1, result.stderr[-3000:]
    assert all(re.fullmatch(r"train: precision fp32 \((no native bf16|RARELM_CPU_BF16=0)\)"
                            r"(; fp32 products by (mkl|onednn) \(.+\))?", line) for line in before), before
    assert_one_line_error(subprocess.CompletedProcess(result.args, result.returncode, result.stdout, error),
                          "rarelm train: error: out of memory (", "); lower train.batch_size")
    assert result.returncode == 2
    assert not any((tmp_path / name).exists() for name in ("model", "train.json", "train.csv"))


def run_statuses(db: Path) -> list[str]:
    """The status of every MLflow run in a SQLite store, oldest first."""
    import sqlite3

    with contextlib.closing(sqlite3.connect(db)) as con:
        return [status for (status,) in con.execute("SELECT status FROM runs ORDER BY start_time")]


@pytest.mark.parametrize(("blocked", "message"), [
    ("model", "File exists (something other than a folder is where a folder is needed: move it aside)"),
    ("train.csv", "Is a directory (a folder is where a file is needed: move the folder aside)"),
    ("train.json", "Is a directory (a folder is where a file is needed: move the folder aside)"),
], ids=["first", "middle", "last"])
def test_train_outputs_change_together_or_not_at_all(upto_weights, tmp_path, blocked, message):
    """The first, a middle or the last of train's outputs (models/model, plots/train.csv,
    metrics/train.json) blocked by a thing of the other kind, then training with another seed.
    Was (`mkdir plots/train.csv`): exit 2 and "no half-written output is left", but models/model
    replaced by the new weights beside the old run's metrics and curves; the file where the model
    folder goes silently replaced, exit 0."""
    assert train_stage(upto_weights, tmp_path).returncode == 0
    outputs = [tmp_path / "model", tmp_path / "train.csv", tmp_path / "train.json"]
    before = tree_digest(*outputs)
    target = tmp_path / blocked
    shutil.rmtree(target) if target.is_dir() else target.unlink()
    if blocked == "model":
        target.write_text("mine")
    else:
        target.mkdir()
    before = {k: v for k, v in before.items() if not k.startswith(str(target))}
    result = train_stage(upto_weights, tmp_path, seed=1341)
    *log, error = result.stderr.strip().splitlines()
    assert all(line.startswith(("train: ", "step ")) for line in log), result.stderr  # its progress
    assert error == f"rarelm train: error: {target}: {message}"
    assert result.returncode == 2
    assert tree_digest(*(p for p in outputs if p != target)) == before
    assert target.read_text() == "mine" if blocked == "model" else list(target.iterdir()) == []
    assert leftovers(tmp_path) == []
    assert run_statuses(tmp_path / "m.db") == ["FINISHED", "FAILED"]


EVAL_OUTPUTS = ["plots/eval_buckets.csv", "plots/eval_term_bands.csv", "metrics/eval_occurrences.jsonl",
                "metrics/eval.json", "metrics/summary.json"]  # in the order evaluate writes them


@pytest.mark.parametrize("blocked", [EVAL_OUTPUTS[0], EVAL_OUTPUTS[2], EVAL_OUTPUTS[-1]],
                         ids=["first", "middle", "last"])
def test_evaluate_outputs_change_together_or_not_at_all(dag, tmp_path, blocked):
    """The first, a middle or the last of evaluate's outputs blocked by a folder, then evaluate
    with other params. Was (`mkdir metrics/eval.json`): exit 2, but the plots and the occurrences
    replaced, the new summary metrics logged to MLflow and the run left RUNNING."""
    root = clone(dag, tmp_path / "repo")
    outputs = [root / rel for rel in EVAL_OUTPUTS]
    target = root / blocked
    target.unlink()
    target.mkdir()
    before = tree_digest(*(p for p in outputs if p != target))
    runs_before = run_statuses(root / "mlflow.db")
    set_params(root, **{"eval.max_terms": 5})  # every output would change
    result = stage("evaluate", root)
    *log, error = result.stderr.strip().splitlines()
    assert "Traceback" not in result.stderr and not any("error" in line for line in log), result.stderr
    assert error == (f"rarelm evaluate: error: {blocked}: Is a directory (a folder is where a file is "
                     "needed: move the folder aside)")
    assert result.returncode == 2
    assert tree_digest(*(p for p in outputs if p != target)) == before
    assert list(target.iterdir()) == []
    assert leftovers(root / "metrics") == [] and leftovers(root / "plots") == []
    assert "RUNNING" not in runs_before
    # the DAG trained untracked in its second run: evaluate made a run of its own, now FAILED
    assert run_statuses(root / "mlflow.db") == [*runs_before, "FAILED"]


# Each stage before train: its outputs (as dvc.yaml lists them) under upto_weights, the options that
# move them elsewhere, the other inputs it reads there, and a param that changes every output.
STAGE_OUTPUTS = {
    "prepare": ([("data/prepared", "--out"), ("metrics/prepare.json", "--metrics")], [],
                {"corpus.split_seed": 7}),
    "tokenize": ([("data/tokenized", "--out"), ("metrics/tokenize.json", "--metrics")],
                 ["--prepared", "data/prepared"], {"tokenizer.vocab_size": 600}),
    "rare_terms": ([("data/rare", "--out"), ("metrics/rare_terms.json", "--metrics")],
                   ["--prepared", "data/prepared", "--tokenized", "data/tokenized"],
                   {"rare.rare_share": 0.1}),
    "weights": ([("data/weights", "--out"), ("metrics/weights.json", "--metrics"),
                 ("plots/weights.csv", "--plot")],
                ["--tokenized", "data/tokenized", "--rare", "data/rare"], {"alpha": 0.3}),
}


@pytest.mark.parametrize("name,blocked", [
    ("prepare", 0), ("prepare", -1), ("tokenize", 0), ("tokenize", -1), ("rare_terms", 0), ("rare_terms", -1),
    ("weights", 0), ("weights", 1), ("weights", -1)],
    ids=["prepare-first", "prepare-last", "tokenize-first", "tokenize-last", "rare_terms-first",
         "rare_terms-last", "weights-first", "weights-middle", "weights-last"])
def test_stage_outputs_change_together_or_not_at_all(upto_weights, tmp_path, name, blocked):
    """The first, a middle (weights has three outputs) or the last output of a stage blocked by a
    thing of the other kind (a file where its folder goes, a folder where a file goes), then the
    stage with a param that changes every output. Was (`mkdir metrics/prepare.json`): exit 2, but
    data/prepared replaced by the new split beside the old stats."""
    outputs, inputs, change = STAGE_OUTPUTS[name]
    args = [str(upto_weights / rel) if rel.startswith("data/") else rel for rel in inputs]
    for rel, option in outputs:  # the previous run's outputs, moved here by the stage's options
        dest = tmp_path / Path(rel).name
        (shutil.copytree if (upto_weights / rel).is_dir() else shutil.copy2)(upto_weights / rel, dest)
        args += [option, str(dest)]
    paths = [tmp_path / Path(rel).name for rel, _ in outputs]
    target = paths[blocked]
    if target.is_dir():
        shutil.rmtree(target)
        target.write_text("mine")
        message = "File exists (something other than a folder is where a folder is needed: move it aside)"
    else:
        target.unlink()
        target.mkdir()
        message = "Is a directory (a folder is where a file is needed: move the folder aside)"
    before = tree_digest(*(p for p in paths if p != target))
    params = yaml.safe_load((upto_weights / "params.yaml").read_text())
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    set_params(tmp_path, **change)
    result = stage(name, upto_weights, "--params", str(tmp_path / "params.yaml"), *args)
    assert_one_line_error(result)
    assert result.stderr.strip() == f"rarelm {name}: error: {target}: {message}"
    assert result.returncode == 2
    assert tree_digest(*(p for p in paths if p != target)) == before
    assert target.read_text() == "mine" if target.is_file() else list(target.iterdir()) == []
    assert leftovers(tmp_path) == []
    target.unlink() if target.is_file() else target.rmdir()  # unblocked, every output changes
    assert stage(name, upto_weights, "--params", str(tmp_path / "params.yaml"), *args).returncode == 0
    for path in paths:  # the param changes every output: the unchanged ones above say something
        if path != target:
            assert tree_digest(path) != {f: d for f, d in before.items() if f.startswith(str(path))}, path


def test_a_launcher_killed_with_sigkill_leaves_a_folder_the_next_one_removes(upto_weights, tmp_path):
    """After `kill -9` of a training (launcher and workers), its empty /tmp/rarelm-train-errors-*
    folder stayed for good. Its name now carries the launcher's pid, and the next launcher
    removes the folders of launchers that are gone (rarelm/files.py `remove_stale_folders`)."""
    temp = tmp_path / "tmp"
    temp.mkdir()
    params = yaml.safe_load((upto_weights / "params.yaml").read_text())
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    set_params(tmp_path, **{"train.nproc": 2, "train.max_steps": 2})
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "TMPDIR": str(temp),
           "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'm.db'}"}
    args = [sys.executable, "-m", "stages.train", "--params", str(tmp_path / "params.yaml"), "--cache",
            str(tmp_path / "cache"), "--out", str(tmp_path / "model"), "--metrics",
            str(tmp_path / "train.json"), "--plots", str(tmp_path / "train.csv"), "--no-progress"]
    proc = subprocess.Popen(args, cwd=upto_weights, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        while not list(temp.glob("rarelm-train-errors-*")):  # the launcher is at torchrun
            assert proc.poll() is None, "the training ended before its launcher made its folder"
            time.sleep(0.1)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert len(list(temp.glob("rarelm-train-errors-*"))) == 1  # SIGKILL: nobody could remove it
    result = subprocess.run(args, cwd=upto_weights, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert list(temp.glob("rarelm-train-errors-*")) == []  # (torchelastic_* folders are torch's)


def test_prepare_with_an_unwritable_metrics_folder_keeps_the_previous_split(upto_weights, tmp_path):
    """Issue 56 row 2 as found: `metrics/` not writable (a read-only bind mount there; here its
    mode, or the immutable attribute for root), then prepare on another split. Was: exit 2, but
    data/prepared replaced, and the line named the temporary file. Now the line names
    metrics/prepare.json and the cause, and data/prepared is the previous split."""
    prepared, metrics = tmp_path / "prepared", tmp_path / "metrics" / "prepare.json"
    shutil.copytree(upto_weights / "data/prepared", prepared)
    metrics.parent.mkdir()
    shutil.copy2(upto_weights / "metrics/prepare.json", metrics)
    before = tree_digest(prepared, metrics)
    params = yaml.safe_load((upto_weights / "params.yaml").read_text())
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    set_params(tmp_path, **{"corpus.split_seed": 7})
    with unwritable(metrics.parent):
        result = stage("prepare", upto_weights, "--params", str(tmp_path / "params.yaml"), "--out",
                       str(prepared), "--metrics", str(metrics))
    cause = ("Operation not permitted (give your user access to it (ls -ld; lsattr for the immutable "
             "attribute))" if os.geteuid() == 0 else
             "Permission denied (give your user access to it (ls -ld; chmod/chown) or use another folder)")
    assert result.stderr.strip() == f"rarelm prepare: error: {metrics}: {cause}"
    assert result.returncode == 2
    assert tree_digest(prepared, metrics) == before
    assert leftovers(tmp_path) == [] and leftovers(metrics.parent) == []


def test_a_batch_size_that_cannot_fit_is_one_line_before_allocating(upto_weights, tmp_path):
    """`train.batch_size: 1000000000`: was validated, then 96 s and 16 GB of resident memory
    before the MemoryError's line. Now the launcher refuses it from the batch, the window and the
    model's size (rarelm/train/bounds.py) before it allocates anything."""
    params = yaml.safe_load((upto_weights / "params.yaml").read_text())
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    set_params(tmp_path, **{"train.batch_size": 10**9, "train.nproc": 2})
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
           "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'm.db'}"}
    with open(tmp_path / "err", "w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "stages.train", "--params", str(tmp_path / "params.yaml"),
             "--cache", str(tmp_path / "cache"), "--out", str(tmp_path / "model"),
             "--metrics", str(tmp_path / "train.json"), "--plots", str(tmp_path / "train.csv"),
             "--no-progress"], cwd=upto_weights, env=env, stdout=subprocess.DEVNULL, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
    # block_size 32, 32 dims, 1 layer: 10^9 x 33 x 16 bytes of windows + 10^9 x 32 x 32 x 2 x 2 of activations
    need = 10**9 * 33 * 16 + 10**9 * 32 * 32 * 2 * 2
    assert need == 4_624_000_000_000
    result = subprocess.CompletedProcess(proc.args, proc.returncode, "", (tmp_path / "err").read_text())
    line = assert_one_line_error(
        result, "rarelm train: error: params: train.batch_size = 1000000000 does not fit: one step needs at "
        "least 4624.0 GB a process (1000000000 x 33 token positions and their activations (32 dims x 2 "
        "layer outputs)), and this machine has ",
        " available for 2 process(es); lower train.batch_size (raise train.grad_accum to keep the batch) "
        "or model.block_size")
    free_gb = float(re.search(r"this machine has ([0-9.]+) GB", line).group(1))
    assert 0 < free_gb * 1e9 < 2 * need
    assert result.returncode == 2
    assert usage.ru_maxrss < 2 * 2**20, usage.ru_maxrss  # KiB: the launcher's imports, no batch
    assert sorted(p.name for p in tmp_path.iterdir()) == ["err", "params.yaml"]


def test_a_training_listens_on_loopback_only(upto_weights, tmp_path):
    """Every socket a two-rank training listens on, sampled while it runs: the launcher's
    rendezvous store, rank 0's process-group store, both ranks' gloo pairs. Was: the torchrun
    agent's store and rank 0's on every interface (`:::36135`, `:::56227`), unauthenticated."""
    params = yaml.safe_load((upto_weights / "params.yaml").read_text())
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    set_params(tmp_path, **{"train.max_steps": 40, "train.nproc": 2})
    log = tmp_path / "train.log"
    proc = start([sys.executable, "-m", "stages.train", "--params", str(tmp_path / "params.yaml"),
                  "--cache", str(tmp_path / "cache"), "--out", str(tmp_path / "model"), "--metrics",
                  str(tmp_path / "train.json"), "--plots", str(tmp_path / "train.csv"), "--no-progress"],
                 upto_weights, log, env={"MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'm.db'}"})
    listening: dict[tuple[int, str, int], str] = {}
    deadline = time.monotonic() + 600
    while proc.poll() is None and time.monotonic() < deadline:
        with contextlib.suppress(psutil.Error):
            launcher = psutil.Process(proc.pid)
            for p in [launcher, *launcher.children(recursive=True)]:
                with contextlib.suppress(psutil.Error):
                    for c in p.net_connections(kind="inet"):
                        if c.status == psutil.CONN_LISTEN:
                            listening[(p.pid, c.laddr.ip, c.laddr.port)] = " ".join(p.cmdline()[1:3])
        time.sleep(0.05)
    assert proc.wait(timeout=60) == 0, log.read_text()[-3000:]
    assert {ip for _, ip, _ in listening} == {"127.0.0.1"}, listening
    assert len({pid for pid, _, _ in listening}) == 3, listening  # the launcher and both ranks
    assert (proc.pid, "127.0.0.1") in {(pid, ip) for pid, ip, _ in listening}, listening
    assert json.loads((tmp_path / "train.json").read_text())["steps"] == 40


# ------------------------------------------------------------------ numeric CLI options bounded

@pytest.mark.parametrize(("args", "message"), [
    (["--bootstrap", "100000000"], "--bootstrap = 100000000 is not allowed (must be in 1..100000)"),
    (["--bootstrap", "0"], "--bootstrap = 0 is not allowed (must be in 1..100000)"),
    (["--seed", "99999999999999999999"], "--seed = 99999999999999999999 is not allowed (must be in "
                                         "0..4294967295)"),
    (["--out", "report.html"], "--out report.html is not a folder; give a folder (made if missing)"),
], ids=["bootstrap-huge", "bootstrap-0", "seed", "out-a-file"])
def test_compare_options_out_of_bounds_are_one_line_before_any_work(tmp_path, args, message):
    """Was: a 44-line MemoryError for 10^8 resamples, 58 lines for --out an existing file."""
    (tmp_path / "report.html").write_text("mine")
    result = run([str(BIN / "rarelm"), "compare", "exp-a", "--baseline", "HEAD", *args], tmp_path)
    assert_one_line_error(result, f"rarelm compare: error: {message}")
    assert result.returncode == 2 and result.stdout == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.html"]
    assert (tmp_path / "report.html").read_text() == "mine"


# ------------------------------------------------------------------------------ smaller items

def test_a_corpus_path_that_is_a_named_pipe_is_called_one(tmp_path):
    """Was: "folder ... holds no .txt, .jsonl, .csv or .parquet file"."""
    os.mkfifo(tmp_path / "corpus.txt")
    (tmp_path / "params.yaml").write_text(yaml.safe_dump({"corpus": {"path": str(tmp_path / "corpus.txt"),
                                                                     "reference_glossary": ""}}))
    result = stage("prepare", tmp_path, "--params", "params.yaml", "--out", "prepared",
                   "--metrics", "prepare.json", timeout=60)
    assert_one_line_error(result, f"rarelm prepare: error: corpus.path: {tmp_path}/corpus.txt is a "
                          "named pipe (FIFO), not a file or folder; point it at the corpus file")
    assert result.returncode == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus.txt", "params.yaml"]


def test_a_tokenizer_folder_of_only_config_json_is_called_so(upto_weights, tmp_path):
    """Was: "tokenize: the train split encodes to no tokens" (transformers builds a tokenizer of an
    empty vocabulary from a config.json alone)."""
    tiny_pretrained(upto_weights, tmp_path / "pretrained")
    for name in ("tokenizer.json", "tokenizer_config.json", "model.safetensors", "generation_config.json"):
        (tmp_path / "pretrained" / name).unlink(missing_ok=True)
    params = yaml.safe_load((upto_weights / "params.yaml").read_text())
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    set_params(tmp_path, **{"tokenizer.name_or_path": str(tmp_path / "pretrained")})
    result = stage("tokenize", upto_weights, "--params", str(tmp_path / "params.yaml"),
                   "--out", str(tmp_path / "tokenized"), "--metrics", str(tmp_path / "tokenize.json"))
    assert_one_line_error(result, f"rarelm tokenize: error: tokenizer.name_or_path: {tmp_path}/pretrained "
                          "holds no tokenizer files, only config.json (its vocabulary is empty)")
    assert result.returncode == 2
    assert not (tmp_path / "tokenized").exists() and not (tmp_path / "tokenize.json").exists()


GLOSSARY = ["idiopathic pneumomyositis", "Idiopathic Pneumomyositis", "nodular adrenonecrosis",
            "NODULAR ADRENONECROSIS", "diffuse angioectasia", "zzz never seen term", "another unseen one",
            "granulomatous glomeruloectasia", "granulomatous  glomeruloectasia", "heparin", "Heparin",
            "warfarin", " ".join(["longterm"] * 40)]


def test_glossary_terms_merged_are_counted_in_one_line_and_one_too_long_is_named(upto_weights, tmp_path):
    """13 glossary terms, 9 kept as their own (case and spacing repeats): one warning line says so
    (was: nothing); a term of 80 tokens, more than evaluate can test with model.block_size 32, is
    refused by `weights` in one line naming it (was: by evaluate, after training, unnamed)."""
    (tmp_path / "glossary.txt").write_text("\n".join(GLOSSARY) + "\n")
    params = yaml.safe_load((upto_weights / "params.yaml").read_text())
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    set_params(tmp_path, **{"rare.glossary": str(tmp_path / "glossary.txt")})
    result = stage("rare_terms", upto_weights, "--params", str(tmp_path / "params.yaml"),
                   "--out", str(tmp_path / "rare"), "--metrics", str(tmp_path / "rare.json"))
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stderr == (f"rarelm rare_terms: warning: rare.glossary {tmp_path}/glossary.txt lists 13 "
                             "terms, 9 kept: 4 repeat another one, the same but for case or spacing (e.g. "
                             "'Idiopathic Pneumomyositis' is 'idiopathic pneumomyositis'); terms are "
                             "compared in lower case with single spaces, and the last spelling is kept\n")
    rows = [json.loads(line) for line in (tmp_path / "rare/terms.jsonl").read_text().splitlines()]
    assert sum(row["source"] == "glossary" for row in rows) == 9
    result = stage("weights", upto_weights, "--params", str(tmp_path / "params.yaml"), "--rare",
                   str(tmp_path / "rare"), "--out", str(tmp_path / "weights"), "--metrics",
                   str(tmp_path / "weights.json"), "--plot", str(tmp_path / "weights.csv"))
    assert_one_line_error(result, "rarelm weights: error: rare.glossary: the term 'longterm longterm ",
                          "evaluate tests terms of at most 13 tokens with model.block_size = 32")
    assert result.returncode == 2
    assert not any((tmp_path / name).exists() for name in ("weights", "weights.json", "weights.csv"))
