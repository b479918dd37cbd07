"""A fixed headline plan without DVC: its experiments as concurrent processes of the real stages.

    rarelm run-plan --plan smollm2/foldoc_en.yaml --out records/realtext/smollm2_foldoc_en --jobs 9
    rarelm headline --plan smollm2/foldoc_en.yaml --out records/realtext/smollm2_foldoc_en   # the tables

For a machine where DVC cannot run the plan: a GPU lent for minutes, with torch but no dvc or mlflow
(`--set tracking.required=false`). Each experiment of the plan's final round (every configuration and
decode variant x final seed, named as `rarelm headline` names them) gets the repo's params.yaml with
the plan's overrides, then the `--set`s; every stage runs as `python -m stages.<name>` with its paths
under `--work`. A stage's work is keyed as DVC's run cache keys it: by the values of the params
dvc.yaml declares for it, and the key of the stage before it. So experiments that share a corpus share
one prepare ... weights, and a decode variant (evaluation params only) evaluates the model its
configuration trained, trained once; a kNN-LM variant (knn.enabled) or one retrieving by the model's
states (retrieval.dense) first runs the datastore stage
on that model, keyed by the datastore's params, so variants that differ in k, lambda or T share one
store. The data stages run first; then up to `jobs` trainings and
evaluations at once, each evaluation as soon as its model is there. A stage whose output
is already there (`done` beside it) is not run again: a stopped command resumes, and data stages run
on one machine can travel to another (`--only data`).

As each evaluation finishes, the experiment's record is written under `<out>/runs/<experiment>/`
(rarelm/report/records.py: params.yaml, metrics/eval.json, the occurrences gzipped, the commit; here
also metrics/train.json), which `rarelm headline` reads instead of DVC experiments; an experiment
whose stages another plan already ran in the same `--work` is recorded too, so that `rarelm
headline` finds every experiment of the plan and runs none. `<out>/runner.json` holds each stage's
seconds and exit code, the machine and the commit.
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from rarelm.errors import RarelmError
from rarelm.files import atomic_dir, read_json, write_json
from rarelm.knn import needs_store
from rarelm.params import Params, read_yaml
from rarelm.paths import EVAL_METRICS, EVAL_OCCURRENCES, PARAMS, SUMMARY_METRICS
from rarelm.report.headline_plan import Plan
from rarelm.report.records import COMMIT, RECORDS, RUN_PLAN, ZIPPED, recorded

DATA_STAGES = ("prepare", "tokenize", "rare_terms", "weights")
DONE = "done"  # written last in a stage's folder: its outputs are complete


@dataclasses.dataclass
class Task:
    """One stage run: its command, the folder it writes, the tasks it waits for."""

    name: str
    stage: str
    root: Path
    argv: list[str]
    after: list[str] = dataclasses.field(default_factory=list)
    experiments: list[str] = dataclasses.field(default_factory=list)  # whose record it completes


def with_overrides(params: dict, overrides: list[str]) -> dict:
    """`params` with `dvc exp run -S` style overrides (`key.sub=value`, value as YAML 1.2 as DVC reads
    it: `5e-5` is a number); an unknown key is an error, as for `-S`.

    >>> with_overrides({"seed": 1, "train": {"lr": 0.1}}, ["seed=2", "train.lr=5e-5"])
    {'seed': 2, 'train': {'lr': 5e-05}}
    """
    out = json.loads(json.dumps(params))
    for item in overrides:
        key, sep, value = item.partition("=")
        *parents, leaf = key.strip().split(".")
        node = out
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
        if not sep or not isinstance(node, dict) or leaf not in node:
            raise RarelmError(f"override {item!r}: params.yaml has no {key.strip()!r}")
        node[leaf] = read_yaml(value, f"override {item!r}")  # as DVC reads -S values: YAML 1.2
    return out


def declared_params(dvc_yaml: Path) -> dict[str, list[str]]:
    """Each stage of dvc.yaml -> the params it declares (leaf keys or sections of params.yaml)."""
    try:
        stages = yaml.safe_load(dvc_yaml.read_text(encoding="utf-8"))["stages"]
    except (OSError, yaml.YAMLError, KeyError, TypeError) as exc:
        raise RarelmError(f"{dvc_yaml}: cannot read the stages' params ({exc})") from None
    return {name: [p for p in stage.get("params", []) if isinstance(p, str)]
            for name, stage in stages.items()}


def stage_key(params: dict, names: list[str], before: str = "") -> str:
    """A short hash of the values of params `names` and the key of the stage before.

    >>> stage_key({"a": {"b": 1}, "c": 2}, ["a.b"]) == stage_key({"a": {"b": 1}, "c": 3}, ["a.b"])
    True
    """
    def value(name: str) -> Any:
        node = params
        for part in name.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        return node

    text = json.dumps({"before": before, **{n: value(n) for n in names}}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def plan_tasks(plan: Plan, repo: Path, work: Path, extra: list[str]
               ) -> tuple[dict[str, Task], dict[str, dict]]:
    """The stage runs of the plan's final round, shared where their keys agree; and each experiment's
    resolved params."""
    base = read_yaml((repo / PARAMS).read_text(encoding="utf-8"), repo / PARAMS)
    declared = declared_params(repo / "dvc.yaml")
    names = [*plan.configurations, *plan.decode]
    tasks: dict[str, Task] = {}
    resolved: dict[str, dict] = {}
    for experiment, overrides in plan.batch(names, plan.final_seeds, {}, plan.final_split):
        params = resolved[experiment] = with_overrides(base, [*overrides, *extra])
        folders = stage_folders(params, declared, work)
        prev: list[str] = []
        for stage, folder in folders.items():
            if folder.name not in tasks:
                argv = stage_argv(stage, folder, folders)
                tasks[folder.name] = Task(folder.name, stage, folder, argv, prev)
                _write_params(folder, params)
            prev = [folder.name]
        root = work / "experiments" / experiment
        tasks[experiment] = Task(experiment, "evaluate", root, stage_argv("evaluate", root, folders),
                                 after=prev, experiments=[experiment])
        _write_params(root, params)
    return tasks, resolved


def stage_folders(params: dict, declared: dict[str, list[str]], work: Path) -> dict[str, Path]:
    """The work folder of every stage before evaluate that an experiment with these params needs,
    `<stage>-<key>`: each key chains the stage's declared params to the keys before it, so
    experiments that agree up to a stage share its folder (the datastore only where evaluate reads
    a store)."""
    stages = (*DATA_STAGES, "train", "datastore") if needs_store(Params.from_dict(params)) \
        else (*DATA_STAGES, "train")
    key, folders = "", {}
    for stage in stages:
        key = stage_key(params, declared[stage], key)
        folders[stage] = work / f"{stage}-{key}"
    return folders


def _write_params(root: Path, params: dict) -> None:
    root.mkdir(parents=True, exist_ok=True)
    (root / PARAMS).write_text(yaml.safe_dump(params, sort_keys=False, allow_unicode=True), encoding="utf-8")


def stage_argv(stage: str, root: Path, at: dict[str, Path]) -> list[str]:
    """`python -m stages.<stage>` with every path under the work folder."""
    out = {s: at[s] / "out" for s in DATA_STAGES}
    paths = {
        "prepare": ["--out", out["prepare"], "--metrics", root / "prepare.json"],
        "tokenize": ["--prepared", out["prepare"], "--out", out["tokenize"],
                     "--metrics", root / "tokenize.json"],
        "rare_terms": ["--prepared", out["prepare"], "--tokenized", out["tokenize"],
                       "--out", out["rare_terms"], "--metrics", root / "rare_terms.json"],
        "weights": ["--tokenized", out["tokenize"], "--rare", out["rare_terms"], "--out", out["weights"],
                    "--metrics", root / "weights.json", "--plot", root / "weights.csv"],
        "train": ["--tokenized", out["tokenize"], "--rare", out["rare_terms"], "--weights", out["weights"],
                  "--out", root / "model", "--metrics", root / "train.json", "--plots", root / "train.csv",
                  "--cache", root / "cache", "--no-progress"],
        "datastore": ["--model", at["train"] / "model", "--tokenized", out["tokenize"],
                      "--out", root / "out"],
        "evaluate": ["--model", at["train"] / "model", "--prepared", out["prepare"], "--tokenized",
                     out["tokenize"], "--rare", out["rare_terms"], "--metrics", root / EVAL_METRICS,
                     "--summary", root / SUMMARY_METRICS, "--train-metrics", at["train"] / "train.json",
                     "--occurrences", root / EVAL_OCCURRENCES, "--plots", root / "plots",
                     *(["--datastore", at["datastore"] / "out"] if "datastore" in at else [])],
    }[stage]
    return [sys.executable, "-m", f"stages.{stage}", "--params", str(root / PARAMS), *map(str, paths)]


class Runner:
    """Runs the tasks, at most `jobs` at once, each after those it waits for; logs to work/logs/."""

    def __init__(self, tasks: dict[str, Task], work: Path, jobs: int, log: Callable[[str], None],
                 finished: Callable[[Task], None]):
        self.tasks, self.work, self.jobs, self.log, self.finished = tasks, work, jobs, log, finished
        self.t0 = time.time()
        self.report: dict[str, dict[str, Any]] = {}

    def run(self, names: list[str]) -> list[str]:
        """Run `names` (in order where they wait on nothing else); the names that failed. Stopped
        (Ctrl-C, SIGTERM), it stops the stage processes it started before it ends."""
        waiting, running, failed = list(names), {}, []
        try:
            self._loop(waiting, running, failed)
        except BaseException:
            for process, _ in running.values():
                process.terminate()  # each stage removes its temporaries and ends its MLflow run
            for process, _ in running.values():
                process.wait()
            raise
        return failed

    def _loop(self, waiting: list[str], running: dict, failed: list[str]) -> None:
        while waiting or running:
            for name in [n for n in waiting if self._ready(n, running, failed)][:self.jobs - len(running)]:
                waiting.remove(name)
                running[name] = self._start(self.tasks[name])
            for name in [n for n in waiting if any(a in failed for a in self.tasks[n].after)]:
                waiting.remove(name)
                failed.append(name)
                self.log(f"{name}: not run ({', '.join(self.tasks[name].after)} failed)")
            for name, (process, started) in list(running.items()):
                if process.poll() is not None:
                    del running[name]
                    if not self._end(self.tasks[name], process.returncode, time.time() - started):
                        failed.append(name)
            if running:
                time.sleep(0.5)

    def _ready(self, name: str, running: dict, failed: list[str]) -> bool:
        return not any(a in running or a in failed or not (self.tasks[a].root / DONE).is_file()
                       for a in self.tasks[name].after)

    def _start(self, task: Task):
        self.log(f"{task.stage} {task.name}: started")
        logs = self.work / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        with (logs / f"{task.name}.log").open("w") as out:
            process = subprocess.Popen(task.argv, stdout=out, stderr=subprocess.STDOUT,
                                       env={**os.environ, "PYTHONUNBUFFERED": "1"})
        return process, time.time()

    def _end(self, task: Task, code: int, seconds: float) -> bool:
        # the work folder's own path left out: runner.json travels with the records
        last = _last_line(self.work / "logs" / f"{task.name}.log").replace(str(self.work), "<work>")
        self.report[task.name] = {"stage": task.stage, "seconds": round(seconds, 1), "rc": code,
                                  "ended_at_s": round(time.time() - self.t0, 1), "last_line": last}
        if code:
            self.log(f"{task.stage} {task.name}: FAILED (exit {code}) after {seconds:.0f} s: {last}")
            return False
        (task.root / DONE).write_text(f"{seconds:.1f}\n")
        self.log(f"{task.stage} {task.name}: done in {seconds:.0f} s: {last[:200]}")
        self.finished(task)
        return True


def _last_line(path: Path) -> str:
    lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    return lines[-1].strip() if lines else ""


def write_record(out: Path, experiment: str, root: Path, train_root: Path, commit: str,
                 ran: dict[str, Any]) -> None:
    """`<out>/runs/<experiment>/` as rarelm/report/records.py reads it, from an evaluated experiment;
    `ran` (its stages' seconds, the machine) goes to run-plan.json."""
    with atomic_dir(Path(out) / RECORDS / experiment) as tmp:
        write_json(tmp / RUN_PLAN, ran)
        (tmp / "metrics").mkdir()
        shutil.copy(root / PARAMS, tmp / PARAMS)
        shutil.copy(root / EVAL_METRICS, tmp / EVAL_METRICS)
        shutil.copy(train_root / "train.json", tmp / "metrics" / "train.json")
        data = (root / EVAL_OCCURRENCES).read_bytes()
        (tmp / ZIPPED[EVAL_OCCURRENCES]).write_bytes(gzip.compress(data, mtime=0))
        (tmp / COMMIT).write_text(commit + "\n", encoding="utf-8")


def run_plan(plan_path: Path, repo: Path, out: Path, work: Path, jobs: int = 4, extra: list[str] = (),
             only: str = "all", commit: str = "", log: Callable[[str], None] = print) -> dict:
    """Run the plan's final round (`only`: "data" stops after the data stages); returns runner.json."""
    plan = Plan.load(plan_path)
    if not plan.fixed:
        raise RarelmError(f"{plan_path}: run-plan runs fixed comparisons (screen_seeds: []); a plan "
                          "with a screening round chooses between rounds: run it with `rarelm headline`")
    if jobs < 1:
        raise RarelmError(f"--jobs {jobs}: must be >= 1")
    repo, work = Path(repo).resolve(), Path(work).resolve()
    os.environ.setdefault("MLFLOW_TRACKING_URI", f"sqlite:///{work / 'mlflow.db'}")
    tasks, resolved = plan_tasks(plan, repo, work, list(extra))
    todo = needed(tasks, [e for e in resolved if e not in recorded(out)])
    commit, host = commit or _commit(repo), machine()
    clock = time.time()

    def stamped(message: str) -> None:
        log(f"run-plan [{time.time() - clock:6.0f} s] {message}")

    def finished(task: Task, reused: frozenset[str] | None = None) -> None:
        """Records the task's experiments; `reused`: those already recorded, skipped (stages run before)."""
        if not task.experiments:  # a data stage or a training
            return
        trained = tasks[task.after[0]]
        if trained.stage == "datastore":  # kNN-LM or dense retrieval: the store's model
            trained = tasks[trained.after[0]]
        seconds = {t: runner.report.get(t, {}).get("seconds") for t in (trained.name, task.name)}
        for experiment in task.experiments:
            if reused is not None and experiment in reused:
                continue
            write_record(out, experiment, task.root, trained.root, commit,
                         {"machine": host, "train_s": seconds[trained.name],
                          "evaluate_s": seconds[task.name]})
            before = "" if reused is None else " (its stages ran before, in --work)"
            stamped(f"recorded {experiment}{before}")

    runner = Runner(tasks, work, jobs, stamped, finished)
    failed = runner.run([n for n in todo if tasks[n].stage in DATA_STAGES])
    if only != "data" and not failed:
        failed = runner.run([n for n in todo if tasks[n].stage not in DATA_STAGES])
    if only != "data" and not failed:  # an experiment another plan ran in this --work: its record here too
        already = frozenset(recorded(out))  # one scan of <out>/runs/
        for task in tasks.values():
            if task.experiments and (task.root / DONE).is_file():
                finished(task, reused=already)
    report = {"plan": str(plan_path), "commit": commit, "machine": host, "jobs": jobs,
              "wall_s": round(time.time() - clock, 1), "experiments": sorted(resolved),
              "tasks": runner.report, "failed": failed}
    write_json(Path(out) / "runner.json", _merge(Path(out) / "runner.json", report))
    # the round's wall time: this command's where it ran a stage (a resumed round counts from the
    # resume, as `rarelm headline` counts it), else what an earlier command wrote
    if only != "data" and not failed and (todo or not (Path(out) / "headline.json").is_file()):
        write_json(Path(out) / "headline.json", {"rounds_s": {"confirm": report["wall_s"]},
                                                 "cpu": report["machine"]["name"], "cores": os.cpu_count()})
    if failed:
        raise RarelmError(f"{len(failed)} stage run(s) failed: {', '.join(failed[:4])}; "
                          f"logs in {work / 'logs'}")
    return report


def needed(tasks: dict[str, Task], experiments: list[str]) -> list[str]:
    """The tasks that `experiments` need and that have not run yet (no `done`), in task order."""
    wanted, stack = set(), list(experiments)
    while stack:
        name = stack.pop()
        if name not in wanted and not (tasks[name].root / DONE).is_file():
            wanted.add(name)
            stack.extend(tasks[name].after)
    return [n for n in tasks if n in wanted]


def _merge(path: Path, report: dict) -> dict:
    """runner.json: this command's report, the stage times of earlier commands on the same out kept."""
    earlier = read_json(path) if path.is_file() else {}
    return {**report, "tasks": {**earlier.get("tasks", {}), **report["tasks"]}}


def _commit(repo: Path) -> str:
    from rarelm.tracking.naming import git_commit

    return git_commit(repo) or "unknown"


def machine() -> dict[str, Any]:
    """What ran the stages: the GPU's name where there is one, else the CPU's."""
    from rarelm.report.headline_outputs import cpu_name

    try:
        import torch

        if torch.cuda.is_available():
            gpus = f"{torch.cuda.get_device_name(0)} ({torch.cuda.device_count()} GPU)"
            return {"name": f"{gpus}, {cpu_name()}",
                    "torch": torch.__version__, "cuda": torch.version.cuda}
        return {"name": cpu_name(), "torch": torch.__version__}
    except ImportError:
        return {"name": cpu_name()}
