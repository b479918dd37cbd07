"""The data a stage read, as MLflow datasets whose digest is the md5 that dvc.lock records.

    dataset_inputs(["data/tokenized"], "training")   # the runs table's Dataset column
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import yaml


def dvc_hashes(paths: list[str | Path], lock: str | Path = "dvc.lock") -> dict[str, str]:
    """{path as dvc.lock names it: md5} for each path that some stage of dvc.lock outputs.

    A path whose files on disk differ in count or size from what dvc.lock records
    (the lock is stale: a stage ran outside DVC) is left out rather than given a
    hash that is not its own.
    """
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


def dataset_inputs(paths: list[str | Path], context: str) -> list:
    """The paths dvc.lock (in the current folder) knows, as MLflow DatasetInputs.

    Each is a dataset named after its path, with DVC's md5 as its digest and `context`
    ("training", "evaluation") as its role.
    """
    # mlflow (~2 s) only once a run logs
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
    return datasets
