"""MLflow tracking: one run per trained model, shared by `train` and `evaluate`.

The store is `$MLFLOW_TRACKING_URI`, or else the embedded SQLite store
`sqlite:///<repo root>/mlflow.db` where the repo root is `$DVC_ROOT` (set by DVC,
even inside the temporary copies that queued experiments run in) or the
current folder. `train` starts the run and leaves its id beside the model;
`evaluate` re-opens it from there:

    run = start_run(params, stage="train", inputs=["data/tokenized"])  # inert if tracking is off
    run.log_metrics({"train/loss": 2.5}, step=10)
    run.save("models/model/mlflow_run.json")
    run.log_model("models/model", params.tracking)  # a pyfunc (rarelm/serving.py)
    run.finish()                                    # or run.finish("FAILED")

    run = open_run("models/model/mlflow_run.json", "evaluate", params)  # the store this process logs to
    run.log_metrics({"eval/ppl": 12.3})
    run.finish()

The run file is JSON: {"run_id": ..., "tracking_uri": ..., "experiment": ...}.

Metric names, one prefix per family (the UI draws one chart section per prefix):
`summary/<k>` the few to read first (SUMMARY), `train/<k>` and `val/<k>` step curves,
`final/<k>` metrics/train.json at the end, `eval/<k>` (`eval/<split>/<k>`) metrics/eval.json,
`system/<k>` MLflow's system metrics. Counts and constants (NOT_MEASURED, `n_*`) are no
metrics: they stay in JSON artifacts (`final/train.json`, `eval/eval.json`, `upstream.json`
with the earlier stages' metrics/<stage>.json) and tags.

The run is named after the DVC experiment under `dvc exp run` ($DVC_EXP_NAME),
else `<stage>-<short commit>`. Tags: `stage` (the stage that started it), `stages`
(every stage that logged into it: "train,evaluate"), `git_commit`, `DVC_EXP_NAME`
and `DVC_EXP_BASELINE_REV` (under `dvc exp run`), and MLflow's own
`mlflow.source.{name,type,git.commit,git.branch,git.repoURL}` and `mlflow.user`.
The experiment carries `mlflow.experimentKind` = custom_model_development, so
the UI opens it as model training, not GenAI. Params: all of params.yaml,
flattened (`train.lr`). Inputs: the data folders a stage read, as MLflow
datasets whose digest is the md5 that dvc.lock records for them.

A run that cannot log fails the stage (`Run.require()`: one error line, exit 2,
before any output is written) unless `tracking.required: false`; then one warning
line goes to stderr and the Run turns inert. Network calls are bounded
(MLFLOW_HTTP_REQUEST_MAX_RETRIES / _TIMEOUT default to 1 retry and 5 s here unless
set), so a down server costs seconds, not minutes. `import mlflow` (~2 s) happens
only when a run starts.

A SQLite store is created and migrated once, under a lock file beside it
(`prepare_store`), before any writer touches it: parallel `dvc queue` workers on a
fresh store would otherwise race through MLflow's schema migration and lose their
runs. Its artifact paths follow it when the checkout is copied or moved
(`relocate_store`), and the run file names the repo's own store by a relative URI,
so a copy never writes into the original. Credentials never leave the process:
URIs are redacted (`redact`) in every message and file, and the git remote is
logged without its user info.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from rarelm.errors import RarelmError
from rarelm.files import write_json

EXPERIMENT_KIND = {"mlflow.experimentKind": "custom_model_development"}  # the UI's "Model training"
EXPERIMENT_NOTE = (  # the experiment's description (mlflow.note.content), shown above its runs table
    "One run per trained model (rarelm: rare domain terms). Read the `summary/` metrics first: "
    "term NLL, term-token accuracy, term exact match (all terms, terms seen <= 15 times in train), "
    "em50 (train occurrences for 50% exact match), overall and frequent-bucket perplexity, training "
    "tokens/s. Step curves are under `train/` and `val/`; every evaluation figure under `eval/` and "
    "in the artifact `eval/eval.json`; counts and constants in the artifacts (`upstream.json`, "
    "`final/train.json`) and tags. Register a run's model with `rarelm register RUN`; "
    "`models:/rarelm@champion` is the one chosen to serve (`rarelm champion VERSION`).")
# summary/<name>: the metrics file key behind it; a short family that a person reads first
SUMMARY = {"term_nll_per_char": "term_nll_per_char", "term_token_acc": "term_token_acc",
           "term_exact_match": "term_exact_match",
           "term_exact_match_le15": "term_exact_match_le15", "false_insertion": "false_insertion_rate",
           "ppl": "ppl", "ppl_frequent": "ppl_frequent", "em50_train_count": "em50_train_count",
           "tokens_per_s": "tokens_per_s"}
# metrics-file keys that count or restate settings: artifacts and tags, not MLflow metrics (`n_*` too)
NOT_MEASURED = {"steps", "tokens", "epochs", "parameters", "trainable_parameters", "state_bytes_per_rank",
                "gen_unique_tokens", "human_unique_tokens", "logit_adjust_tau"}
UI = "http://127.0.0.1:5000"  # where `make ui` serves the store
MODEL_LOG_LIMIT = 2 * 1024**3  # tracking.log_model: auto logs models with fewer bytes of weights
# what the MLflow model is called with: rarelm/serving.py's params and defaults
SERVING_DEFAULTS = {"max_new_tokens": 32, "do_sample": True, "temperature": 0.8, "top_k": 50,
                    "top_p": 0.95, "seed": 0}
INPUT_EXAMPLE = (["The patient was"], SERVING_DEFAULTS)  # shown in the UI, checked at logging
TABLE_ROWS = 10_000  # term samples shown as a table in the UI; the full file is an artifact too
_HTTP_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1",
                  "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
                  "MLFLOW_HTTP_REQUEST_TIMEOUT": "5",
                  "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false"}  # no bar in a stage's log


STORE_LOCK_TIMEOUT = 300  # seconds to wait for another process creating or migrating the store
# scheme://user:password@host -> scheme://***@host; ?token=... -> ?token=***
_USERINFO = re.compile(r"(?P<scheme>\b[a-zA-Z][a-zA-Z0-9+.-]*://)[^/\s@]+@")
_SECRET_QUERY = re.compile(r"(?P<key>[?&](?:[a-z_]*(?:password|passwd|pwd|token|secret|key|sig|signature|"
                           r"credential)[a-z_]*)=)[^&\s#]+", re.IGNORECASE)


def redact(text: str) -> str:
    """`text` with the credentials of every URI in it replaced by ***.

    >>> redact("store http://alice:s3cret@mlflow:5000/x?token=abc&n=1 is down")
    'store http://***@mlflow:5000/x?token=***&n=1 is down'
    >>> redact("sqlite:////repo/mlflow.db")
    'sqlite:////repo/mlflow.db'
    """
    return _SECRET_QUERY.sub(r"\g<key>***", _USERINFO.sub(r"\g<scheme>***@", text))


def without_userinfo(url: str) -> str:
    """A git remote URL without user name or token (an scp-like `git@host:path` has no secret).

    >>> without_userinfo("https://oauth2:ghp_abc@github.com/org/rarelm.git")
    'https://github.com/org/rarelm.git'
    >>> without_userinfo("git@github.com:org/rarelm.git")
    'git@github.com:org/rarelm.git'
    """
    return _SECRET_QUERY.sub(r"\g<key>***", _USERINFO.sub(r"\g<scheme>", url))


def repo_root() -> Path:
    """$DVC_ROOT if set (the real workspace, even in an experiment's temp copy), else cwd."""
    return Path(os.environ.get("DVC_ROOT") or os.getcwd()).resolve()


def tracking_uri() -> str:
    """$MLFLOW_TRACKING_URI, else sqlite:///<repo root>/mlflow.db (absolute)."""
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{repo_root() / 'mlflow.db'}"


def is_default_store(uri: str) -> bool:
    """Whether `uri` is the repo's own embedded store, sqlite:///<repo root>/mlflow.db."""
    return not os.environ.get("MLFLOW_TRACKING_URI") and uri == tracking_uri()


def run_file_uri(uri: str) -> str:
    """The store as the run file records it: the repo's own store relative to the repo root
    (so a copied checkout's model names the copy's store), any other redacted.

    >>> run_file_uri("http://alice:s3cret@mlflow:5000")
    'http://***@mlflow:5000'
    """
    return "sqlite:///mlflow.db" if is_default_store(uri) else redact(uri)


def logs_text(log_text: str, uri: str) -> bool:
    """Whether test-corpus text goes to the store: tracking.log_text, `auto` = a store on this machine.

    >>> logs_text("auto", "sqlite:////repo/mlflow.db"), logs_text("auto", "https://mlflow.example.com")
    (True, False)
    """
    if log_text != "auto":
        return log_text == "true"
    return uri.startswith(("sqlite:", "file:")) or "://" not in uri


def sqlite_path(uri: str) -> Path | None:
    """The database file of a sqlite:/// URI, else None.

    >>> sqlite_path("sqlite:////repo/mlflow.db")
    PosixPath('/repo/mlflow.db')
    >>> sqlite_path("http://mlflow:5000") is None
    True
    """
    return Path(uri.removeprefix("sqlite:///")) if uri.startswith("sqlite:///") else None


def artifact_location(uri: str, experiment: str) -> str | None:
    """Where a new experiment's artifacts go: beside a SQLite store, <its folder>/mlruns/<name>.

    MLflow's default is ./mlruns of the process that creates the experiment, which under
    `dvc exp run --queue` is DVC's temporary copy of the workspace, deleted after the run:
    every later run's artifacts (model, reports) would point into a folder that is gone.
    Other stores (a tracking server) choose for themselves: None.

    >>> artifact_location("sqlite:////repo/mlflow.db", "rarelm")
    '/repo/mlruns/rarelm'
    >>> artifact_location("http://mlflow:5000", "rarelm") is None
    True
    """
    if not uri.startswith("sqlite:///"):
        return None
    folder = Path(uri.removeprefix("sqlite:///")).parent
    return str(folder / "mlruns" / experiment.replace("/", "_"))


def _git(*args: str, cwd: Path | None = None) -> str:
    """`git <args>`'s output, or "" outside a git repo (or without git)."""
    try:
        out = subprocess.run(["git", *args], cwd=cwd or repo_root(),
                             capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return out.stdout.strip() if out.returncode == 0 else ""


def git_commit(cwd: Path | None = None) -> str:
    """The checked-out commit, or "" outside a git repo."""
    return _git("rev-parse", "HEAD", cwd=cwd)


def run_name(stage: str, commit: str) -> str | None:
    """The DVC experiment's name under `dvc exp run`, else "<stage>-<short commit>".

    >>> run_name("train", "2c46d84f00aa")
    'train-2c46d84'
    """
    return os.environ.get("DVC_EXP_NAME") or (f"{stage}-{commit[:7]}" if commit else None)


def ui_url(experiment_id: str | None, base: str = UI) -> str:
    """The MLflow UI's page for an experiment's runs, in its model-training (not GenAI) view.

    >>> ui_url("1")
    'http://127.0.0.1:5000/#/experiments/1?workflowType=machine_learning'
    """
    page = f"experiments/{experiment_id}" if experiment_id else "experiments"
    return f"{base}/#/{page}?workflowType=machine_learning"


def flatten(data: Any, prefix: str = "", sep: str = ".") -> dict[str, float]:
    """Numeric leaves of nested dicts as {"a.b": 1.0}; strings and lists are skipped.

    >>> flatten({"train": {"tokens": 10, "name": "x"}, "vocab": 5}, "tokenize.")
    {'tokenize.train.tokens': 10.0, 'tokenize.vocab': 5.0}
    """
    out: dict[str, float] = {}
    if isinstance(data, dict):
        for key, value in data.items():
            out.update(flatten(value, f"{prefix}{key}{sep}", sep))
    elif isinstance(data, (int, float)) and not isinstance(data, bool):
        out[prefix.removesuffix(sep)] = float(data)
    return out


def upstream_metrics(metrics_dir: str | Path, stages: list[str]) -> dict[str, float]:
    """metrics/<stage>.json of every stage that has one, as "upstream/<stage>/<key>"."""
    out: dict[str, float] = {}
    for stage in stages:
        path = Path(metrics_dir) / f"{stage}.json"
        if path.is_file():
            try:
                out.update(flatten(json.loads(path.read_text(encoding="utf-8")),
                                   f"upstream/{stage}/", sep="/"))
            except (OSError, ValueError):
                continue  # a broken metrics file is that stage's problem, not tracking's
    return out


def summary_metrics(metrics: dict[str, Any]) -> dict[str, float]:
    """The `summary/` family from a metrics file's dict (eval.json or train.json): what exists of it.

    >>> summary_metrics({"term_exact_match": 0.5, "term_token_acc": 0.8, "n_eval_terms": 9, "ppl": None})
    {'summary/term_token_acc': 0.8, 'summary/term_exact_match': 0.5}
    """
    return {f"summary/{name}": float(metrics[key]) for name, key in SUMMARY.items()
            if isinstance(metrics.get(key), (int, float)) and not isinstance(metrics[key], bool)}


def measured(metrics: dict[str, float]) -> dict[str, float]:
    """MLflow metrics without the counts and constants (NOT_MEASURED, `n_*`), whatever their prefix.

    >>> measured({"eval/ppl": 2.0, "eval/n_eval_terms": 5.0, "final/steps": 9.0, "eval/val/n_x": 1.0})
    {'eval/ppl': 2.0}
    """
    def counted(key: str) -> bool:
        name = key.rsplit("/", 1)[-1]
        return name.startswith("n_") or name in NOT_MEASURED

    return {k: v for k, v in metrics.items() if not counted(k)}


def run_note(params, tags: dict[str, str]) -> str:
    """A run's description (mlflow.note.content): which experiment, from which commit, what changed.

    >>> from rarelm.params import Params
    >>> run_note(Params(), {"DVC_EXP_NAME": "exp-a", "git_commit": "2c46d84f00aa"})[:56]
    'DVC experiment exp-a at commit 2c46d84: alpha 0, loss.ra'
    """
    name = tags.get("DVC_EXP_NAME") or tags.get("mlflow.runName") or "a run"
    commit = tags.get("git_commit", "")[:7] or "unknown"
    flat = params.flat()
    shown = ", ".join(f"{k} {_param_str(flat[k]) if not isinstance(flat[k], float) else f'{flat[k]:g}'}"
                      for k in ("alpha", "loss.rare_weight", "loss.targets", "seed", "train.max_steps"))
    prefix = "DVC experiment " if tags.get("DVC_EXP_NAME") else ""
    return f"{prefix}{name} at commit {commit}: {shown}. Read summary/ first."


def dvc_hashes(paths: list[str | Path], lock: str | Path = "dvc.lock") -> dict[str, str]:
    """{path as dvc.lock names it: md5} for each path that some stage of dvc.lock outputs.

    A path whose files on disk differ in count or size from what dvc.lock records
    (the lock is stale: a stage ran outside DVC) is left out rather than given a
    hash that is not its own.
    """
    import yaml

    lock = Path(lock)
    try:
        stages = (yaml.safe_load(lock.read_text(encoding="utf-8")) or {}).get("stages", {})
    except (OSError, yaml.YAMLError, AttributeError):
        return {}
    outs = {o["path"]: o for stage in stages.values() if isinstance(stage, dict)
            for o in stage.get("outs", []) if isinstance(o, dict) and "md5" in o}
    found = {}
    for path in map(Path, paths):
        name = Path(os.path.relpath(path.resolve(), lock.parent.resolve())).as_posix()
        out = outs.get(name)
        if out is not None and _matches(path, out):
            found[name] = out["md5"]
    return found


def _matches(path: Path, out: dict) -> bool:
    if path.is_file():
        return out.get("size") in (None, path.stat().st_size)
    if not path.is_dir():
        return False
    files = [f for f in path.rglob("*") if f.is_file()]
    return out.get("nfiles") in (None, len(files)) and \
        out.get("size") in (None, sum(f.stat().st_size for f in files))


def check_tensorboard(tracking) -> None:
    """A one-line error when `tracking.tensorboard` is on and the tensorboard package is not."""
    import importlib.util

    if tracking.tensorboard and importlib.util.find_spec("tensorboard") is None:
        raise RarelmError("params: tracking.tensorboard = true needs the tensorboard package "
                          "(pip install -e '.[tensorboard]'), or set it to false")


# --------------------------------------------------------------------------- the SQLite store

_PATH_COLUMNS = (("experiments", "artifact_location"), ("runs", "artifact_uri"),
                 ("logged_models", "artifact_location"), ("model_versions", "storage_location"),
                 ("model_versions", "source"))
STORE_FOLDER_TAG = "rarelm.store_folder"  # on the Default experiment: where the store was prepared


@contextlib.contextmanager
def store_lock(db: Path, timeout: float = STORE_LOCK_TIMEOUT):
    """Hold an exclusive lock on `<db>.lock` (fcntl.flock) for the block.

    Where no lock file can be made (a read-only folder) nothing can create or migrate
    the store either, and the block runs unlocked.
    """
    import fcntl

    lock = db.with_name(db.name + ".lock")
    fd = None
    for flags in (os.O_RDWR | os.O_CREAT, os.O_RDONLY):
        with contextlib.suppress(OSError):
            fd = os.open(lock, flags, 0o644)
            break
    if fd is None:
        yield
        return
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise RarelmError(f"MLflow store {db}: another process has held {lock} for "
                                      f"{timeout:.0f} s; is a stage hanging?") from None
                time.sleep(0.05)
        yield
    finally:
        os.close(fd)  # and with it the lock


def _leftover_tables(db: Path) -> list[str]:
    """Tables an interrupted MLflow (alembic) migration leaves behind: `_alembic_tmp_<table>`."""
    import sqlite3

    if not db.is_file():
        return []
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as con:
        rows = con.execute("SELECT name FROM sqlite_master WHERE type = 'table' "
                           "AND name LIKE '\\_alembic\\_tmp\\_%' ESCAPE '\\'").fetchall()
        return sorted(r[0] for r in rows)


def _count_runs(db: Path) -> int:
    import sqlite3

    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as con:
        try:
            return con.execute("SELECT count(*) FROM runs").fetchone()[0]
        except sqlite3.Error:  # no runs table yet
            return 0


def prepare_store(uri: str, stage: str) -> None:
    """Create or migrate a SQLite store once, under its lock, before this process writes to it.

    MLflow creates and migrates a fresh store on first use, with no lock between
    processes: parallel writers on a fresh store (`dvc queue start -j 3`) run the same
    migration at once, fail ("duplicate column name: step") and can leave it
    half-migrated. Here the first writer does it while the others wait for the lock.
    A half-migrated store (a leftover `_alembic_tmp_<table>`) that holds no runs is
    recreated, since nothing is lost; one that holds runs is refused with the fix.
    Then the store's artifact paths are made to follow it (`relocate_store`).
    Other stores (a tracking server) migrate themselves: nothing to do.
    """
    db = sqlite_path(uri)
    if db is None:
        return
    db = Path(os.path.abspath(db))
    with store_lock(db):
        leftover = _leftover_tables(db)
        if leftover:
            runs = _count_runs(db)
            if runs:
                raise RarelmError(
                    f"MLflow store {db} is half-migrated (leftover table {leftover[0]} from an "
                    f"interrupted schema migration) and holds {runs} runs: back it up, then move it "
                    f"aside (mv {db} {db}.broken) to start a new store")
            db.unlink()
            print(f"rarelm {stage}: warning: MLflow store {db} was half-migrated (leftover table "
                  f"{leftover[0]}) and held no runs: created it anew", file=sys.stderr, flush=True)
        import mlflow

        mlflow.MlflowClient(uri).search_experiments(max_results=1)  # creates, migrates or checks it
        relocate_store(db)


def _moved(value: str, old: str, new: str) -> str:
    """`value` with its <old>/mlruns/ prefix (a path or a file:// URI) replaced by <new>/mlruns/.

    >>> _moved("file:///a/repo/mlruns/0", "/a/repo", "/b/copy")
    'file:///b/copy/mlruns/0'
    >>> _moved("/a/repo2/mlruns/0", "/a/repo", "/b/copy")
    '/a/repo2/mlruns/0'
    """
    return re.sub(rf"^(file://)?{re.escape(old)}/mlruns/", lambda m: f"{m.group(1) or ''}{new}/mlruns/",
                  value)


def _recorded_folder(con) -> str | None:
    """Where the store was last prepared: its tag, or (a store from before the tag) the one
    folder that the experiments rarelm made (tagged EXPERIMENT_KIND) keep their artifacts under."""
    row = con.execute("SELECT value FROM experiment_tags WHERE key = ? AND experiment_id = 0",
                      (STORE_FOLDER_TAG,)).fetchone()
    if row:
        return row[0]
    (key, value), = EXPERIMENT_KIND.items()
    rows = con.execute("SELECT e.artifact_location FROM experiments e JOIN experiment_tags t "
                       "ON t.experiment_id = e.experiment_id WHERE t.key = ? AND t.value = ?",
                       (key, value)).fetchall()
    folders = {m.group(2) for (loc,) in rows if (m := re.match(r"^(file://)?(/.*)/mlruns/[^/]+$", loc or ""))}
    return folders.pop() if len(folders) == 1 else None


def relocate_store(db: Path) -> None:
    """Point a copied or moved SQLite store's artifact paths at <its folder>/mlruns/.

    MLflow records artifact locations as absolute paths (experiments, runs, logged models,
    model versions). rarelm keeps them under <store folder>/mlruns/, and a copied checkout
    carries mlflow.db and mlruns/ along; without this its new runs would write their
    artifacts under the original's mlruns/. The folder the store was last prepared in is
    its Default experiment's tag `rarelm.store_folder`; when the store now lies elsewhere,
    every recorded `<old>/mlruns/...` becomes `<new>/mlruns/...`. Paths elsewhere are kept.
    """
    import sqlite3

    here = str(db.parent)
    with contextlib.closing(sqlite3.connect(db, timeout=60)) as con, con:
        old = _recorded_folder(con)
        if old == here:
            return
        if old is not None:
            for table, column in _PATH_COLUMNS:
                if column not in {r[1] for r in con.execute(f"PRAGMA table_info({table})")}:
                    continue
                rows = con.execute(f"SELECT rowid, {column} FROM {table} WHERE {column} LIKE ?",
                                   (f"%{old}/mlruns/%",)).fetchall()
                for rowid, value in rows:
                    con.execute(f"UPDATE {table} SET {column} = ? WHERE rowid = ?",
                                (_moved(value, old, here), rowid))
        con.execute("INSERT OR REPLACE INTO experiment_tags (key, value, experiment_id) VALUES (?, ?, 0)",
                    (STORE_FOLDER_TAG, here))


def _reason(exc: BaseException) -> str:
    """An exception as one redacted line; rarelm's own messages whole, a database error by its
    driver's words, others cut at 200 characters.

    >>> _reason(Exception("(raised as a result of autoflush) (sqlite3.OperationalError) attempt to "
    ...                   "write a readonly database [SQL: INSERT INTO runs ...]"))
    'sqlite3.OperationalError: attempt to write a readonly database'
    """
    text = " ".join(str(exc).split())
    if isinstance(exc, RarelmError):
        return redact(text)
    driver = re.search(r"\((sqlite3\.\w+|psycopg2?\.\w+|pymysql\.\w+)\) ([^\[]+)", text)
    if driver:
        return redact(f"{driver.group(1)}: {driver.group(2).strip()}")
    return redact(f"{type(exc).__name__}: {text[:200]}")


def _weights_bytes(model_dir: Path) -> int:
    return sum(f.stat().st_size for f in model_dir.iterdir()
               if f.suffix in (".safetensors", ".bin", ".pt", ".pth"))


class Run:
    """One MLflow run seen through a client; every call is a no-op once it is inert."""

    def __init__(self, stage: str, uri: str, experiment: str, run_id: str | None = None,
                 system_metrics: bool = False, required: bool = False):
        self.stage, self.tracking_uri, self.experiment = stage, uri, experiment
        self.run_id = run_id
        self.system_metrics = system_metrics
        self.required = required  # tracking.required: a store that fails is an error, not a warning
        self.error: BaseException | None = None  # why the run turned inert
        self._tensorboard = None  # a SummaryWriter under runs/<run name>/ (tracking.tensorboard)
        self._client = None
        self._monitor = None
        self._thread = None  # connecting in the background (start_run(background=True))

    def _join(self) -> None:
        import threading

        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
            self._thread = None

    @property
    def active(self) -> bool:
        self._join()
        return self._client is not None and self.run_id is not None

    def _fail(self, exc: BaseException) -> None:
        """Turn inert; print the one warning line, or keep the error for require()."""
        if self.error is None:
            self.error = exc
            if not self.required:
                print(f"rarelm {self.stage}: warning: MLflow tracking store {redact(self.tracking_uri)} "
                      f"is not reachable ({_reason(exc)}); going on without tracking",
                      file=sys.stderr, flush=True)
        self._stop_monitor()
        self._client = None

    def require(self) -> None:
        """Raise the one-line error if the run could not log and `tracking.required` is on."""
        self._join()
        if self.required and self.error is not None:
            raise RarelmError(f"MLflow tracking store {redact(self.tracking_uri)} cannot log "
                              f"({_reason(self.error)}); fix it, or set tracking.required: false "
                              "to go on without tracking")

    def _note(self, what: str, exc: BaseException) -> None:
        """One warning line for a part that failed while the store answers; the run goes on."""
        print(f"rarelm {self.stage}: warning: {what} not logged to MLflow ({_reason(exc)})",
              file=sys.stderr, flush=True)

    def _connect(self, params_flat: dict[str, Any] | None, tags: dict[str, str],
                 resume: bool, inputs: tuple[tuple[list, str], ...] = ()) -> None:
        for key, value in _HTTP_DEFAULTS.items():
            os.environ.setdefault(key, value)
        import logging

        import mlflow
        from mlflow.entities import Param, RunTag

        logging.getLogger("mlflow").setLevel(logging.WARNING)  # no INFO chatter on stderr
        # a failed SQL statement (a read-only store) is logged there with its traceback (~90 lines)
        # before it is raised again: the one line of _fail or require() says it
        logging.getLogger("mlflow.store.db.utils").setLevel(logging.CRITICAL)
        prepare_store(self.tracking_uri, self.stage)
        client = mlflow.MlflowClient(self.tracking_uri)
        if resume:
            client.update_run(self.run_id, status="RUNNING")
        else:
            experiment = client.get_experiment_by_name(self.experiment)
            if experiment is None:
                try:
                    experiment_id = client.create_experiment(
                        self.experiment, artifact_location=artifact_location(self.tracking_uri,
                                                                             self.experiment),
                        tags=EXPERIMENT_KIND | {"mlflow.note.content": EXPERIMENT_NOTE})
                except mlflow.exceptions.MlflowException:  # created meanwhile by a parallel run?
                    experiment = client.get_experiment_by_name(self.experiment)
                    if experiment is None:  # no: the store refused (read-only, ...)
                        raise
                    experiment_id = experiment.experiment_id
            else:
                experiment_id = experiment.experiment_id
                for key, value in (EXPERIMENT_KIND | {"mlflow.note.content": EXPERIMENT_NOTE}).items():
                    if key not in experiment.tags:  # a store from before the tag
                        client.set_experiment_tag(experiment_id, key, value)
            run = client.create_run(experiment_id, run_name=tags.get("mlflow.runName") or None)
            self.run_id = run.info.run_id
        params = [Param(k, _param_str(v)) for k, v in (params_flat or {}).items()]
        client.log_batch(self.run_id, params=params,
                         tags=[RunTag(k, v) for k, v in tags.items() if v and k != "mlflow.runName"])
        self._client = client
        for paths, context in inputs:
            self.log_datasets(paths, context)
        if self.system_metrics:
            from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

            self._monitor = SystemMetricsMonitor(self.run_id, resume_logging=resume,
                                                 tracking_uri=self.tracking_uri)
            self._monitor.start()

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        if self._tensorboard is not None and step is not None:  # the step curves, tracked or not
            for key, value in metrics.items():
                if key.startswith(("train/", "val/")):
                    self._tensorboard.add_scalar(key, value, step)
        if not self.active or not metrics:
            return
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        try:
            self._client.log_batch(self.run_id, metrics=[
                Metric(k, float(v), now, step or 0) for k, v in metrics.items()])
        except Exception as exc:  # tracking must never stop training
            self._fail(exc)

    def log_json(self, data: dict, artifact_file: str) -> None:
        """A dict as a JSON artifact of the run (counts and constants: not metrics)."""
        if not self.active or not data:
            return
        try:
            self._client.log_dict(self.run_id, data, artifact_file)
        except Exception as exc:
            self._note(artifact_file, exc)

    def set_tags(self, tags: dict[str, str]) -> None:
        if not self.active:
            return
        try:
            for key, value in tags.items():
                self._client.set_tag(self.run_id, key, value)
        except Exception as exc:
            self._fail(exc)

    def log_datasets(self, paths: list[str | Path], context: str) -> None:
        """Log the paths dvc.lock (in the current folder) knows as MLflow dataset inputs.

        Each becomes a dataset named after its path, with DVC's md5 as its digest and
        `context` ("training", "evaluation") as its role: the runs table's Dataset column.
        """
        if not self.active:
            return
        try:
            import warnings

            from mlflow.data.dataset_source_registry import resolve_dataset_source
            from mlflow.data.meta_dataset import MetaDataset
            from mlflow.entities import DatasetInput, InputTag
            from mlflow.utils.mlflow_tags import MLFLOW_DATASET_CONTEXT

            datasets = []
            for path, md5 in dvc_hashes(paths).items():
                with warnings.catch_warnings():  # "can be interpreted in multiple ways": local
                    warnings.simplefilter("ignore")
                    source = resolve_dataset_source(path)
                dataset = MetaDataset(source, name=path, digest=md5)
                datasets.append(DatasetInput(dataset._to_mlflow_entity(),
                                             [InputTag(MLFLOW_DATASET_CONTEXT, context)]))
            if datasets:
                self._client.log_inputs(self.run_id, datasets=datasets)
        except Exception as exc:
            self._note("datasets", exc)

    def log_table(self, rows: list[dict], artifact_file: str) -> None:
        """Rows as an MLflow table (the UI shows it in the run's artifacts), replacing any earlier one.

        MlflowClient.log_table appends to an existing table, so an evaluation re-run
        into the same run would double its rows; this writes the same format instead.
        """
        if not self.active or not rows:
            return
        try:
            import tempfile

            import pandas as pd
            from mlflow.utils.mlflow_tags import MLFLOW_LOGGED_ARTIFACTS

            with tempfile.TemporaryDirectory() as tmp:
                local = Path(tmp) / Path(artifact_file).name
                pd.DataFrame(rows[:TABLE_ROWS]).to_json(local, orient="split", index=False)
                self._client.log_artifact(self.run_id, str(local),
                                          artifact_path=str(Path(artifact_file).parent))
            tag = json.loads(self._client.get_run(self.run_id).data.tags.get(MLFLOW_LOGGED_ARTIFACTS, "[]"))
            if {"path": artifact_file, "type": "table"} not in tag:
                tag.append({"path": artifact_file, "type": "table"})
                self._client.set_tag(self.run_id, MLFLOW_LOGGED_ARTIFACTS, json.dumps(tag))
        except Exception as exc:
            self._note(f"table {artifact_file}", exc)

    def log_model(self, model_dir: str | Path, tracking) -> str | None:
        """Log a saved causal LM folder (model + tokenizer + model card) as a text-generation model.

        `tracking` is params.tracking: `log_model` auto (weights under 2 GB) / true /
        false; with `register` true also a new version of `registered_model` (see
        rarelm.registry for registering later, by command). Returns the model's URI
        (`models:/<name>/<version>` when registered), or None. A failure is one warning
        line; the run goes on. The MLflow model is rarelm/serving.py (a pyfunc) with the
        folder as its artifact "model"; serve it with
        `mlflow models serve -m models:/rarelm@champion --env-manager local`.
        """
        model_dir = Path(model_dir).resolve()  # a path, not a hub id: MLflow looks nothing up online
        if not self.active or tracking.log_model == "false" or \
                (tracking.log_model == "auto" and _weights_bytes(model_dir) >= MODEL_LOG_LIMIT):
            return None
        import logging

        t0 = time.perf_counter()
        quiet = logging.getLogger("mlflow.models"), logging.getLogger("mlflow.pyfunc")
        levels = [logger.level for logger in quiet]
        try:
            import mlflow

            for logger in quiet:  # no notes on the input example's validation
                logger.setLevel(logging.ERROR)
            mlflow.set_tracking_uri(self.tracking_uri)  # Model.log's own client
            # and its experiment: MLflow files a logged model under the current fluent experiment
            # (else Default), not under its run's, and the run's Models column stays empty
            mlflow.set_experiment(experiment_id=self._client.get_run(self.run_id).info.experiment_id)
            # mlflow.pyfunc.log_model itself, but into this run (it logs into the active run only)
            info = mlflow.models.Model.log(
                artifact_path=None, name="model", flavor=mlflow.pyfunc, run_id=self.run_id,
                flavor_name="pyfunc.ModelFromCode",
                python_model=str(Path(__file__).with_name("serving.py")),
                artifacts={"model": str(model_dir)}, signature=_generation_signature(),
                input_example=INPUT_EXAMPLE, pip_requirements=_requirements())
            uri = info.model_uri
            if tracking.register and tracking.registered_model:
                from rarelm import registry

                version = registry.register(self._client, tracking.registered_model, self.run_id)
                uri = f"models:/{tracking.registered_model}/{version}"
        except Exception as exc:  # the flavour or the registry failed: a note, not a failed run
            self._note("model", exc)
            return None
        finally:
            for logger, level in zip(quiet, levels, strict=True):
                logger.setLevel(level)
        print(f"rarelm {self.stage}: model logged to MLflow as {uri} "
              f"({time.perf_counter() - t0:.1f} s)", file=sys.stderr, flush=True)
        return uri

    def save(self, path: str | Path) -> None:
        """Write the run file (run_id, run_file_uri(tracking_uri), experiment); nothing if inert."""
        if self.active:
            write_json(path, {"run_id": self.run_id, "tracking_uri": run_file_uri(self.tracking_uri),
                              "experiment": self.experiment})

    def _stop_monitor(self) -> None:
        if self._monitor is not None:
            monitor, self._monitor = self._monitor, None
            try:
                monitor.finish()
            except Exception:  # noqa: BLE001 - the monitor's own thread may already be gone
                pass

    def finish(self, status: str = "FINISHED") -> None:
        """End the run as FINISHED, FAILED or KILLED; the Run is inert afterwards."""
        if self._tensorboard is not None:
            self._tensorboard.close()
            self._tensorboard = None
        if not self.active:
            return
        self._stop_monitor()
        try:
            self._client.set_terminated(self.run_id, status)
        except Exception as exc:
            self._fail(exc)
        self._client = None


def _param_str(value: Any) -> str:
    return json.dumps(value) if isinstance(value, (list, dict)) else str(value)


def _generation_signature():
    """str in, str out, with generation settings a request may pass (`params`, defaults those of
    `rarelm generate`: rarelm.serving.DEFAULTS)."""
    from mlflow.models import ModelSignature
    from mlflow.types.schema import ColSpec, ParamSchema, ParamSpec, Schema

    types = {int: "long", bool: "boolean", float: "double"}
    return ModelSignature(Schema([ColSpec("string")]), Schema([ColSpec("string")]), params=ParamSchema([
        ParamSpec(name, types[type(value)], value) for name, value in SERVING_DEFAULTS.items()]))


def _requirements() -> list[str]:
    """Pinned to what is installed here, so MLflow need not infer them (a subprocess, ~10 s)."""
    from importlib.metadata import version

    return [f"{name}=={version(name).split('+')[0]}"  # torch 2.13.0+cpu -> torch==2.13.0
            for name in ("mlflow", "transformers", "tokenizers", "torch", "safetensors")]


def run_tags(stage: str) -> dict[str, str]:
    """The run's name (`mlflow.runName`) and tags; see the module docstring."""
    import getpass

    commit = os.environ.get("DVC_EXP_BASELINE_REV") or git_commit()
    branch = _git("rev-parse", "--abbrev-ref", "HEAD")
    try:
        user = getpass.getuser()
    except (OSError, KeyError):  # no name for this uid (a container)
        user = ""
    return {"mlflow.runName": run_name(stage, commit) or "",
            "stage": stage, "stages": stage, "git_commit": commit,
            "DVC_EXP_NAME": os.environ.get("DVC_EXP_NAME", ""),
            "DVC_EXP_BASELINE_REV": os.environ.get("DVC_EXP_BASELINE_REV", ""),
            "mlflow.source.name": f"stages/{stage}.py", "mlflow.source.type": "LOCAL",
            "mlflow.source.git.commit": commit,
            "mlflow.source.git.branch": "" if branch == "HEAD" else branch,
            "mlflow.source.git.repoURL": without_userinfo(_git("remote", "get-url", "origin")),
            "mlflow.user": user}


def start_run(params, stage: str, run_id: str | None = None, background: bool = False,
              inputs: list[str | Path] = ()) -> Run:
    """Start a run for `params` (a rarelm.params.Params), or resume `run_id` if given.

    Logs every param flattened, the tags above and `inputs` as "training" datasets;
    starts MLflow's system-metrics thread when `params.tracking.system_metrics` is
    on, a TensorBoard writer when `params.tracking.tensorboard` is. Never raises for
    the store: an unreachable one gives an inert Run and one warning line. With
    `background`, connecting (seconds: `import mlflow`, the SQLite store's schema
    check) overlaps with the caller's work; the Run's first use waits for it.
    """
    import threading

    run = Run(stage, tracking_uri(), params.tracking.experiment, run_id,
              system_metrics=params.tracking.system_metrics, required=params.tracking.required)
    tags = run_tags(stage)
    if run_id is None:
        tags["mlflow.note.content"] = run_note(params, tags)
    if params.tracking.tensorboard:
        check_tensorboard(params.tracking)
        from torch.utils.tensorboard import SummaryWriter

        name = tags["mlflow.runName"] or time.strftime(f"{stage}-%Y%m%d-%H%M%S")
        run._tensorboard = SummaryWriter(str(repo_root() / "runs" / name))
    datasets = ((list(inputs), "training"),) if inputs else ()

    def connect() -> None:
        try:
            run._connect(params.flat(), dict(tags), resume=run_id is not None, inputs=datasets)
            return
        except Exception as exc:  # unreachable store, bad URI, read-only file, run deleted...
            error = exc
        if run_id is not None:  # the run to resume is gone (store wiped?): start a new one
            run.run_id = None
            try:
                run._connect(params.flat(), dict(tags), resume=False, inputs=datasets)
                return
            except Exception as exc:
                error = exc
        run.run_id = None
        run._fail(error)

    if background:
        run._thread = threading.Thread(target=connect, name="mlflow-connect", daemon=True)
        run._thread.start()
    else:
        connect()
    return run


def open_run(run_file: str | Path, stage: str, params) -> Run:
    """The run an evaluation logs into, in the store MLFLOW_TRACKING_URI names (else the repo's).

    That is the run that trained the model, named in its run file (written by Run.save),
    when the file names this same store, the run is there and belongs to this DVC
    experiment; it is set RUNNING again. Otherwise (no run file, a model tracked in
    another store, a store without that run, a model that DVC's run cache restored from
    another experiment) a new run in `params.tracking.experiment`, with every param and
    the tag `rarelm.model_run_id` when the file names one. Call finish() when done.
    """
    uri = tracking_uri()
    path = Path(run_file)
    info = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    run = Run(stage, uri, params.tracking.experiment, None, required=params.tracking.required)
    if info.get("tracking_uri") == run_file_uri(uri) and info.get("run_id"):
        try:
            run.run_id, run.experiment = info["run_id"], info.get("experiment") or run.experiment
            if not _model_of_another_experiment(uri, info["run_id"]):
                run._connect(None, {}, resume=True)
                stages = run._client.get_run(run.run_id).data.tags.get("stages", "")
                run.set_tags({"stages": ",".join(filter(None, [stages, stage]))})
                return run
        except Exception:  # noqa: BLE001 - not in this store (or none): a run of its own below
            pass
    run.run_id, run.experiment = None, params.tracking.experiment
    model_run = {"rarelm.model_run_id": info["run_id"]} if info.get("run_id") else {}
    try:
        run._connect(params.flat(), run_tags(stage) | model_run, resume=False)
    except Exception as exc:
        run.run_id = None
        run._fail(exc)
    return run


def _model_of_another_experiment(uri: str, run_id: str) -> bool:
    """Whether this `dvc exp run` re-uses a model trained by another run (DVC's run cache restored it).

    A DVC experiment that changes only `evaluate`'s params (say `eval.logit_adjust_tau`) gets the
    trained model of the experiment that trained it; logging into that run would overwrite its
    evaluation, so such an evaluation gets a run of its own, tagged `rarelm.model_run_id`.
    """
    name = os.environ.get("DVC_EXP_NAME", "")
    if not name:
        return False
    import mlflow

    prepare_store(uri, "evaluate")
    tags = mlflow.MlflowClient(uri).get_run(run_id).data.tags
    return tags.get("DVC_EXP_NAME", "") != name


def log_sweep(experiment: str, name: str, children: list[str], report_dir: str | Path,
              note: str = "", uri: str | None = None) -> str | None:
    """A parent run `name` for a sweep: the runs of DVC experiments `children` become its children
    (tag mlflow.parentRunId, so the runs table nests them), the report folder its artifacts.

    Done after the sweep, from the runs' DVC_EXP_NAME tags, so the sweep's experiments need
    to know nothing of it. Returns the parent's run id; None (one warning line) if the store
    has no such experiment or cannot be reached: a sweep's results stand without it.
    """
    uri = uri or tracking_uri()
    if experiment_id(uri, experiment) is None:
        return None
    try:
        import mlflow

        client = mlflow.MlflowClient(uri)
        found = client.get_experiment_by_name(experiment)
        runs = [r for r in client.search_runs([found.experiment_id], max_results=5000)
                if r.data.tags.get("DVC_EXP_NAME") in set(children)]
        parent = client.create_run(found.experiment_id, run_name=name, tags={
            "mlflow.note.content": note or f"Sweep {name}: {len(runs)} runs; the comparison is "
            "in this run's artifacts (report.md, index.html).", "git_commit": git_commit(), "stage": "sweep"})
        for run in runs:
            client.set_tag(run.info.run_id, "mlflow.parentRunId", parent.info.run_id)
        if Path(report_dir).is_dir():
            client.log_artifacts(parent.info.run_id, str(report_dir))
        client.set_terminated(parent.info.run_id)
        return parent.info.run_id
    except Exception as exc:  # noqa: BLE001 - the sweep's files are written; MLflow is a view of them
        print(f"rarelm headline: warning: sweep not logged to MLflow ({type(exc).__name__}: "
              f"{' '.join(str(exc).split())[:200]})", file=sys.stderr, flush=True)
        return None


def experiment_id(uri: str, name: str) -> str | None:
    """The id of experiment `name` in the store, or None (no such experiment, no store yet).

    A SQLite store is read with sqlite3 (instant; `import mlflow` costs seconds) and
    never created.
    """
    if uri.startswith("sqlite:///"):
        import sqlite3

        db = Path(uri.removeprefix("sqlite:///"))
        if not db.is_file():
            return None
        try:
            with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as con:
                row = con.execute("SELECT experiment_id FROM experiments WHERE name = ? "
                                  "AND lifecycle_stage = 'active'", (name,)).fetchone()
        except sqlite3.Error:
            return None
        return str(row[0]) if row else None
    try:
        import mlflow

        experiment = mlflow.MlflowClient(uri).get_experiment_by_name(name)
    except Exception:  # noqa: BLE001 - without an id the link opens the experiments list
        return None
    return experiment.experiment_id if experiment else None


def main(argv: list[str]) -> int:
    """`python -m rarelm.tracking ui-url [STORE]`: print the UI's link to the runs (`make ui`)."""
    if len(argv) not in (1, 2) or argv[0] != "ui-url":
        print("usage: python -m rarelm.tracking ui-url [TRACKING_URI]", file=sys.stderr)
        return 2
    from rarelm.params import load_params

    try:
        name = load_params("params.yaml").tracking.experiment
    except RarelmError:
        name = "rarelm"
    uri = argv[1] if len(argv) == 2 else tracking_uri()
    print(f"MLflow runs: {ui_url(experiment_id(uri, name))}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
