"""The SQLite store: created and migrated once under a lock, its artifact paths following it.

A SQLite store is created and migrated once, under a lock file beside it
(`prepare_store`), before any writer touches it: parallel `dvc queue` workers on a
fresh store would otherwise race through MLflow's schema migration and lose their
runs. Its artifact paths follow it when the checkout is copied or moved
(`relocate_store`), so a copy never writes into the original:

    >>> _moved("file:///a/repo/mlruns/0", "/a/repo", "/b/copy")
    'file:///b/copy/mlruns/0'
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import sqlite3
import sys
import time
from pathlib import Path

from rarelm.errors import RarelmError
from rarelm.tracking.experiment import EXPERIMENT_KIND
from rarelm.tracking.uri import sqlite_path

STORE_LOCK_TIMEOUT = 300  # seconds to wait for another process creating or migrating the store
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
    if not db.is_file():
        return []
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as con:
        rows = con.execute("SELECT name FROM sqlite_master WHERE type = 'table' "
                           "AND name LIKE '\\_alembic\\_tmp\\_%' ESCAPE '\\'").fetchall()
        return sorted(r[0] for r in rows)


def _count_runs(db: Path) -> int:
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
        import mlflow  # ~2 s: only when a run starts

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
