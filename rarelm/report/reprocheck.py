"""Reproducibility checks for CI and the test suite: same params + data = same outputs.

Two checks, each a subcommand of `python -m rarelm.report.reprocheck`:

    reproduce   run `dvc repro --force` N times from scratch (outputs and the training
                checkpoint cache removed before each run) and compare the output hashes that
                DVC records in dvc.lock: every output must be byte-identical. Metrics and plot
                files may differ only in wall-clock fields (tokens/s, seconds), which are
                compared with those fields left out; an output folder only in the file that
                names its MLflow run (mlflow_run.json, a new run id each time).
    metrics     `dvc metrics diff` of the workspace against committed reference metrics (the
                metrics files and the JSON files among the outs: metrics_files), each
                metric within |new - old| <= atol + rtol * |old|; a Markdown table of the diff
                goes to stdout and, in GitHub Actions, to $GITHUB_STEP_SUMMARY.

Precision: `train.precision: auto` is fp32 on CPUs without native bf16 and, on CPUs with
AVX512-BF16/AMX, bf16 or fp32 as a timed probe of the model finds faster; bf16 moves the
metrics by more than float rounding, so a reference is made with the precision pinned
(.ci/params.yaml: fp32), `reproduce --save-reference` warns when it is `auto`, and `metrics`
fails on a different `precision` in metrics/train.json with a hint saying so.

The reference for `metrics` is a git revision (e.g. HEAD, when CI runs the committed params)
or a folder of metrics files saved by `reproduce --save-reference DIR` (CI-sized params run
in CI; `.ci/reference/`). A folder is turned into a throw-away git commit (HEAD's tree with
those metrics files) so that `dvc metrics diff` itself reads it.

Comparing hashes of dvc.lock entries:

    >>> a = {"data/x": "1.dir", "metrics/train.json": "aa"}
    >>> differing(a, {"data/x": "1.dir", "metrics/train.json": "bb"})
    ['metrics/train.json']
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from rarelm import git
from rarelm.fmt import table_cell
from rarelm.params import read_yaml
from rarelm.paths import MLFLOW_RUN, PARAMS, TRAIN_CACHE

# Metric names and CSV columns that measure time or speed: they vary from run to run by nature.
WALL_CLOCK = re.compile(r"(^|[._/])(wall|time|seconds|elapsed|duration|eta)|per_s(ec)?\b|_s$|"
                        r"tokens_s\b|throughput|samples_s\b", re.IGNORECASE)
# Where the train stage keeps its resumable checkpoints (outside DVC's outputs).
CHECKPOINT_DIRS = (TRAIN_CACHE,)
# Files inside an output folder that name the run rather than its result: the MLflow run id that
# `train` leaves beside the model is new on every run by design.
RUN_IDENTITY_FILES = (MLFLOW_RUN,)
RTOL, ATOL = 0.05, 0.01
# `train.precision: auto` trains in fp32 on CPUs without native bf16 and, on CPUs with
# AVX512-BF16/AMX, in whichever of bf16 and fp32 a timed probe finds faster, so a reference
# saved under `auto` holds only for CPUs of the kind (and model size) that saved it.
PRECISION_HINT = ("train.precision is auto (on CPUs with AVX512-BF16/AMX bf16 where a probe finds "
                  "it faster, fp32 on others): "
                  "pin it (as .ci/params.yaml does) so that the reference holds on every CPU")


class ReproError(RuntimeError):
    """A failed check; the message says which output or metric and how."""


# ---------------------------------------------------------------- dvc.lock and outputs

def lock_hashes(lock: str | Path) -> dict[str, str]:
    """{output path: md5} for every stage output recorded in dvc.lock."""
    data = yaml.safe_load(Path(lock).read_text(encoding="utf-8")) or {}
    out: dict[str, str] = {}
    for stage in (data.get("stages") or {}).values():
        for entry in stage.get("outs") or []:
            out[entry["path"]] = entry.get("md5") or entry.get("hash") or ""
    return out


def differing(first: dict[str, str], second: dict[str, str]) -> list[str]:
    """Paths whose hash differs, or that only one of the two has."""
    return sorted(p for p in set(first) | set(second) if first.get(p) != second.get(p))


def dir_manifest(root: Path, md5: str) -> dict[str, str]:
    """{relpath: md5} of a directory output, from DVC's cache (.dvc/cache/files/md5/xx/yyy.dir)."""
    path = root / ".dvc" / "cache" / "files" / "md5" / md5[:2] / md5[2:]
    try:
        return {e["relpath"]: e["md5"] for e in json.loads(path.read_text())}
    except (OSError, ValueError, KeyError):
        return {}


def without_wall_clock(path: Path) -> Any:
    """A metrics (JSON/YAML) or plots (CSV) file's content, wall-clock fields left out."""
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".csv":
        rows = list(csv.DictReader(io.StringIO(text)))
        return [{k: v for k, v in r.items() if not WALL_CLOCK.search(k)} for r in rows]
    data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)

    def strip(node: Any) -> Any:
        if isinstance(node, dict):
            return {k: strip(v) for k, v in node.items() if not WALL_CLOCK.search(str(k))}
        return node

    return strip(data)


# ---------------------------------------------------------------- running the DAG

def apply_params(root: Path, overlay: str | Path) -> None:
    """Merge an overlay YAML (e.g. .ci/params.yaml) into root/params.yaml, key by key."""
    params_path = root / PARAMS
    # read as DVC and the stages read params (YAML 1.2, a repeated key refused): PyYAML would turn
    # `max_steps: 010` into 8 and write that back
    params = read_yaml(params_path.read_text(encoding="utf-8"), params_path)
    extra = read_yaml(Path(overlay).read_text(encoding="utf-8"), overlay) or {}

    def merge(base: dict, new: dict, prefix: str) -> None:
        for key, value in new.items():
            if key not in base:
                raise ReproError(f"{overlay}: unknown param {prefix}{key}")
            if isinstance(value, dict):
                merge(base[key], value, f"{prefix}{key}.")
            else:
                base[key] = value

    merge(params, extra, "")
    params_path.write_text(yaml.safe_dump(params, sort_keys=False, allow_unicode=True),
                           encoding="utf-8")


def _small_outputs(root: Path) -> list[str]:
    """Metrics and plots files that dvc.yaml declares (compared by content, not only hash): the
    metrics files (metrics_files), a stage's `plots`, and the data of a top-level plot (its id, or
    the files of its `y`)."""
    dvcyaml = yaml.safe_load((root / "dvc.yaml").read_text(encoding="utf-8")) or {}
    paths = metrics_files(root)
    for stage in (dvcyaml.get("stages") or {}).values():
        for entry in stage.get("plots") or []:
            paths.append(next(iter(entry)) if isinstance(entry, dict) else entry)
    for entry in dvcyaml.get("plots") or []:
        name, spec = next(iter(entry.items())) if isinstance(entry, dict) else (entry, None)
        y = (spec or {}).get("y")
        paths.extend(y if isinstance(y, dict) else [name])
    return paths


def _precision(root: Path) -> str | None:
    """train.precision of root/params.yaml, if it has one."""
    params = yaml.safe_load((root / PARAMS).read_text(encoding="utf-8")) or {}
    return (params.get("train") or {}).get("precision")


def _env(extra: dict | None = None) -> dict:
    """os.environ with this interpreter's bin folder first on PATH (dvc.yaml runs `python`)."""
    bin_dir = str(Path(sys.executable).parent)
    env = {**os.environ, **(extra or {})}
    env["PATH"] = os.pathsep.join([bin_dir, env.get("PATH", "")])
    return env


def run_once(root: Path, clean: tuple[str, ...] = CHECKPOINT_DIRS, env: dict | None = None,
             timeout: float = 3600) -> subprocess.CompletedProcess:
    """`dvc repro --force` from scratch: training checkpoints removed first (DVC removes outputs)."""
    for rel in clean:
        shutil.rmtree(root / rel, ignore_errors=True)
    result = subprocess.run(["dvc", "repro", "--force"], cwd=root, capture_output=True, text=True,
                            env=_env(env), timeout=timeout)
    if result.returncode != 0:
        tail = "\n".join((result.stdout + result.stderr).strip().splitlines()[-20:])
        raise ReproError(f"dvc repro --force exited {result.returncode}:\n{tail}")
    return result


def reproduce(root: str | Path, runs: int = 2, clean: tuple[str, ...] = CHECKPOINT_DIRS,
              env: dict | None = None, save_reference: str | Path | None = None,
              log=print, run_env=None, results: list | None = None) -> dict[str, str]:
    """Run the DAG `runs` times from scratch; raise ReproError unless all outputs match.

    `run_env(i)` may add environment variables for run i (0-based); `results`, if given,
    collects each run's CompletedProcess. Returns the output hashes of the last run.
    """
    root = Path(root)
    small = _small_outputs(root)
    first_hashes: dict[str, str] | None = None
    first_small: dict[str, Any] = {}
    first_manifests: dict[str, dict[str, str]] = {}
    for i in range(runs):
        log(f"reprocheck: run {i + 1}/{runs}: dvc repro --force (from scratch)")
        result = run_once(root, clean, {**(env or {}), **(run_env(i) if run_env else {})})
        if results is not None:
            results.append(result)
        hashes = lock_hashes(root / "dvc.lock")
        contents = {p: without_wall_clock(root / p) for p in small if (root / p).is_file()}
        if first_hashes is None:
            first_hashes, first_small = hashes, contents
            first_manifests = {p: dir_manifest(root, h) for p, h in hashes.items() if h.endswith(".dir")}
            if save_reference:
                save_metrics(root, save_reference)
                if _precision(root) == "auto":
                    log(f"reprocheck: warning: {PRECISION_HINT}")
            continue
        problems = []
        for path in differing(first_hashes, hashes):
            if path in small and first_small.get(path) == contents.get(path):
                log(f"reprocheck: {path}: differs only in wall-clock fields")
                continue
            detail = ""
            if hashes.get(path, "").endswith(".dir"):
                now = dir_manifest(root, hashes[path])
                files = differing(first_manifests.get(path, {}), now)
                if files and all(Path(f).name in RUN_IDENTITY_FILES for f in files):
                    log(f"reprocheck: {path}: differs only in {', '.join(files)} (the run's identity)")
                    continue
                detail = f" (files: {', '.join(files[:10])})" if files else ""
            problems.append(f"{path}: {first_hashes.get(path)} != {hashes.get(path)}{detail}")
        if problems:
            raise ReproError(f"run {i + 1} differs from run 1: " + "; ".join(problems))
    if runs > 1:
        log(f"reprocheck: {len(first_hashes or {})} outputs byte-identical across {runs} runs")
    return hashes


# ---------------------------------------------------------------- metrics against a reference

def metrics_files(root: Path) -> list[str]:
    """dvc.yaml's `metrics:` files and the JSON files among its `outs:` (metrics/train.json,
    metrics/eval.json ...: plain outputs so that `dvc exp show` opens on metrics/summary.json, and
    compared here all the same).

    >>> import tempfile
    >>> root = Path(tempfile.mkdtemp())
    >>> _ = (root / "dvc.yaml").write_text("stages: {s: {outs: [data, m/a.json, {m/b.json: {cache: false}}],"
    ...                                    " metrics: [{m/summary.json: {cache: false}}]}}")
    >>> metrics_files(root)
    ['m/summary.json', 'm/a.json', 'm/b.json']
    """
    stages = (yaml.safe_load((root / "dvc.yaml").read_text(encoding="utf-8")) or {}).get("stages", {})
    found = []
    for kind in ("metrics", "outs"):
        for stage in stages.values():
            for entry in stage.get(kind) or []:
                path = next(iter(entry)) if isinstance(entry, dict) else entry
                if kind == "metrics" or path.endswith(".json"):
                    found.append(path)
    return found


def save_metrics(root: Path, folder: str | Path) -> None:
    """Copy every metrics file dvc.yaml declares into folder (same relative paths)."""
    folder = Path(folder) if Path(folder).is_absolute() else root / folder
    for rel in metrics_files(root):
        if (root / rel).is_file():
            (folder / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(root / rel, folder / rel)


def reference_revision(root: Path, reference: str) -> str:
    """A git revision holding the reference metrics: `reference` itself, or, for a folder,
    a throw-away commit (HEAD's tree, metrics files replaced by the folder's) that no branch
    points to."""
    folder = Path(reference) if Path(reference).is_absolute() else root / reference
    if not folder.is_dir():
        return reference
    index = root / ".git" / "reprocheck-index"
    env = {"GIT_INDEX_FILE": str(index)}
    try:
        git.checked(root, "read-tree", "HEAD", env=env, error=ReproError)
        for rel in metrics_files(root):
            if (folder / rel).is_file():
                blob = git.checked(root, "hash-object", "-w", str(folder / rel), error=ReproError)
                git.checked(root, "update-index", "--add", "--cacheinfo", f"100644,{blob},{rel}", env=env,
                            error=ReproError)
        tree = git.checked(root, "write-tree", env=env, error=ReproError)
    finally:
        index.unlink(missing_ok=True)
    ident = {"GIT_AUTHOR_NAME": "reprocheck", "GIT_AUTHOR_EMAIL": "reprocheck@localhost",
             "GIT_COMMITTER_NAME": "reprocheck", "GIT_COMMITTER_EMAIL": "reprocheck@localhost"}
    return git.checked(root, "commit-tree", tree, "-p", "HEAD", "-m", f"reference metrics {reference}",
                       env=ident, error=ReproError)


def metrics_diff(root: Path, revision: str) -> dict:
    """`dvc metrics diff --json --all <revision>` of metrics_files (workspace against revision)."""
    targets = ["--targets", *metrics_files(root)]
    result = subprocess.run(["dvc", "metrics", "diff", "--json", "--all", revision, *targets], cwd=root,
                            capture_output=True, text=True, env=_env())
    if result.returncode != 0:
        raise ReproError(f"dvc metrics diff failed: {result.stderr.strip()}")
    return json.loads(result.stdout or "{}")


def check_metrics(diff: dict, rtol: float = RTOL, atol: float = ATOL) -> tuple[list[list[str]], list[str]]:
    """Rows (path, metric, reference, workspace, change, verdict) and the failures."""
    rows, failures = [], []
    for path, metrics in sorted(diff.items()):
        for name, d in sorted(metrics.items()):
            old, new = d.get("old"), d.get("new")
            numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (old, new))
            if WALL_CLOCK.search(name):
                verdict = "wall clock, not compared"
            elif not numbers:
                verdict = ("ok" if old == new else "MISSING" if new is None
                           else "NEW" if old is None else "DIFFERS")
            elif math.isfinite(old) and math.isfinite(new) and abs(new - old) <= atol + rtol * abs(old):
                verdict = "ok"
            else:
                verdict = "OUT OF TOLERANCE"
            if verdict not in ("ok", "wall clock, not compared", "NEW"):
                failures.append(f"{path}:{name} {old} -> {new} ({verdict})")
            change = f"{new - old:+.6g}" if numbers else "-"
            rows.append([path, name, table_cell(old), table_cell(new), change, verdict])
    return rows, failures


def markdown(rows: list[list[str]], rtol: float, atol: float, reference: str) -> str:
    lines = [f"### Metrics against {reference} (tolerance: |new - old| <= {atol:g} + {rtol:g} x |old|)",
             "", "| Path | Metric | Reference | Workspace | Change | Verdict |",
             "| --- | --- | --- | --- | --- | --- |"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def compare_metrics(root: str | Path, reference: str, rtol: float = RTOL, atol: float = ATOL,
                    summary: str | Path | None = None, log=print) -> list[list[str]]:
    """Diff the workspace metrics against reference; raise ReproError if any is out of tolerance."""
    root = Path(root)
    rows, failures = check_metrics(metrics_diff(root, reference_revision(root, reference)), rtol, atol)
    table = markdown(rows, rtol, atol, reference)
    log(table)
    if summary:
        with open(summary, "a", encoding="utf-8") as f:
            f.write(table)
    if not rows:
        raise ReproError(f"no metrics to compare against {reference}")
    if failures:
        hint = ""
        if any(f.split()[0].endswith(":precision") for f in failures):
            hint = (" (the reference was trained in another precision; pin train.precision in the "
                    "params overlay, as .ci/params.yaml does)")
        raise ReproError(f"{len(failures)} metric(s) outside tolerance: " + "; ".join(failures) + hint)
    return rows


# ---------------------------------------------------------------- command line

def main(argv: list[str] | None = None) -> int:
    """`python -m rarelm.report.reprocheck reproduce|metrics`: 0 when the check passes, 1 otherwise."""
    parser = argparse.ArgumentParser(prog="python -m rarelm.report.reprocheck",
                                     description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    rep = sub.add_parser("reproduce", help="dvc repro --force N times; outputs must be byte-identical")
    rep.add_argument("--params", help="overlay YAML merged into params.yaml first (e.g. .ci/params.yaml)")
    rep.add_argument("--runs", type=int, default=2)
    rep.add_argument("--save-reference", help="save the first run's metrics files into this folder")
    met = sub.add_parser("metrics", help="dvc metrics diff against a reference, within tolerance")
    met.add_argument("--reference", default="HEAD", help="git revision, or folder of metrics files")
    met.add_argument("--rtol", type=float, default=RTOL)
    met.add_argument("--atol", type=float, default=ATOL)
    met.add_argument("--summary", default=os.environ.get("GITHUB_STEP_SUMMARY"),
                     help="append the Markdown table here (default: $GITHUB_STEP_SUMMARY)")
    args = parser.parse_args(argv)
    root = Path.cwd()
    try:
        if args.command == "reproduce":
            if args.params:
                apply_params(root, args.params)
            reproduce(root, args.runs, save_reference=args.save_reference)
        else:
            compare_metrics(root, args.reference, args.rtol, args.atol, args.summary)
    except ReproError as exc:
        print(f"reprocheck: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
