"""A headline's records: what a comparison reads of each finished experiment, kept with the report.

A DVC experiment lives only in the clone that ran it (a git ref under refs/exps/, DVC's cache): a
fresh clone, CI or another machine has none of them. So `rarelm headline` keeps, for every
experiment of its plan as it finishes, the files `rarelm compare` reads of it (params.yaml,
metrics/eval.json, metrics/eval_occurrences.jsonl gzipped) and its commit under
`<out>/runs/<experiment>/`, committed with the report. Another clone rewrites the tables from them,
and a plan stopped part-way resumes there without running the recorded experiments again. A record
is written once; delete its folder (and the experiment) to run that experiment again.

    >>> import tempfile
    >>> recorded(Path(tempfile.mkdtemp()))        # no records yet
    set()
"""

from __future__ import annotations

import gzip
from pathlib import Path

from rarelm.errors import RarelmError
from rarelm.files import atomic_dir
from rarelm.paths import EVAL_METRICS, EVAL_OCCURRENCES, PARAMS
from rarelm.report.git_runs import read_git, resolve_experiment
from rarelm.report.run_data import RunData, load_files
from rarelm.report.runs import for_split, read_file

RECORDS = "runs"  # <out>/runs/<experiment>/
COMMIT = "commit"  # the experiment's commit, written last: a record without it is not one
# in a record that `rarelm run-plan` wrote (rarelm/report/plan_runner.py): the experiment ran as stage
# processes, not as a DVC experiment; its `commit` is then the code's, which its siblings share
RUN_PLAN = "run-plan.json"
ZIPPED = {EVAL_OCCURRENCES: EVAL_OCCURRENCES + ".gz"}  # the one large file (~0.5 KB per occurrence)


def recorded(out: Path) -> set[str]:
    """Names of the experiments recorded under `<out>/runs/`."""
    root = Path(out) / RECORDS
    return {d.name for d in root.iterdir() if (d / COMMIT).is_file()} if root.is_dir() else set()


def record(repo: Path, out: Path, name: str) -> None:
    """Record DVC experiment `name` of `repo` under `<out>/runs/<name>/` (an existing record is kept)."""
    path = Path(out) / RECORDS / name
    if (path / COMMIT).is_file():
        return
    commit = resolve_experiment(name, Path(repo))
    if commit is None:
        raise RarelmError(f"{name}: neither a DVC experiment of {repo} nor recorded in {path.parent}")
    with atomic_dir(path) as tmp:
        for rel in (PARAMS, EVAL_METRICS, EVAL_OCCURRENCES):
            text = read_git(Path(repo), commit, rel)
            if text is None:
                raise RarelmError(f"{name}: no {rel} at its commit {commit[:10]} (did evaluate run?)")
            target = tmp / ZIPPED.get(rel, rel)
            target.parent.mkdir(parents=True, exist_ok=True)
            data = text.encode("utf-8")
            target.write_bytes(gzip.compress(data, mtime=0) if rel in ZIPPED else data)
        (tmp / COMMIT).write_text(commit + "\n", encoding="utf-8")


def load_recorded(repo: Path, out: Path, name: str, split: str = "") -> RunData:
    """Experiment `name` as `rarelm compare` loads it, from its record (written first if missing)."""
    record(repo, out, name)
    path = Path(out) / RECORDS / name

    def read(rel: str) -> str | None:
        if rel not in ZIPPED:
            return read_file(path / rel)
        try:
            return gzip.decompress((path / ZIPPED[rel]).read_bytes()).decode("utf-8")
        except (OSError, EOFError, UnicodeDecodeError) as exc:
            raise RarelmError(f"{path / ZIPPED[rel]}: cannot read ({exc})") from None

    commit = (path / COMMIT).read_text(encoding="utf-8").strip()
    # a run-plan record's commit is its code's, shared with the plan's other records: not its identity
    source, ident = ("run-plan", f"{commit}/{name}") if (path / RUN_PLAN).is_file() else ("git", commit)
    run = load_files(name, name, source, ident, read)
    run.experiment = name
    return for_split(run, split)
