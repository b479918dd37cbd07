"""Typed, validated params: params.yaml -> frozen dataclasses.

Every section of params.yaml is a dataclass in sections.py; each field declares its
type and, where it has one, its allowed range or choices (checked by checks.py). Loading rejects unknown
keys, wrong types and out-of-range values with one line naming the key, the
value and what is allowed. Every float must be finite and within its field's
bounds (each float has an upper one), seeds within 0..2^32-1, other integers
within int64:

    >>> Params.from_dict({"seed": 1, "alpha": -1})
    Traceback (most recent call last):
    rarelm.errors.RarelmError: params: alpha = -1 is not allowed (must be >= 0)

A stage reads the whole file (so a typo anywhere is caught at once) but DVC
tracks only the keys each stage declares in dvc.yaml. Here: `load_params`, what a stage
calls, and `check_held_params`, what rarelm.files asks before it puts an output in place.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from rarelm.errors import RarelmError
from rarelm.params.checks import read_yaml
from rarelm.params.sections import (
    CorpusParams,
    EvalParams,
    KnnParams,
    LoraParams,
    LossParams,
    ModelParams,
    Params,
    RareParams,
    RetrievalParams,
    TokenizerParams,
    TrackingParams,
    TrainParams,
    WeightsParams,
)

__all__ = ["CorpusParams", "EvalParams", "KnnParams", "LoraParams", "LossParams", "ModelParams", "Params",
           "RareParams", "RetrievalParams", "TokenizerParams", "TrackingParams", "TrainParams",
           "WeightsParams", "check_held_params", "load_params", "read_yaml"]

# The params files a stage read at its start (`load_params(..., hold=True)`): its text and what it
# said. rarelm.files refuses to put an output in place once one of them says something else.
_HELD: dict[Path, tuple[str, Params]] = {}


def load_params(path: str | Path = "params.yaml", hold: bool = False) -> Params:
    """Read and validate params.yaml; a missing or malformed file is a RarelmError.

    With `hold` (the DAG's stages), this run's outputs are refused if the file says something
    else by the time they are written: see `check_held_params`.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise RarelmError(f"params file not found: {path}") from None
    except UnicodeDecodeError as exc:
        raise RarelmError(f"params file {path} is not valid YAML: {exc}") from None
    raw = read_yaml(text, path)
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise RarelmError(f"params file {path} must hold a mapping of sections")
    params = Params.from_dict(raw)
    if hold:
        _HELD[path] = (text, params)
    return params


def check_held_params() -> None:
    """Refuse to save outputs if a held params file now says something else than at the start.

    A second `dvc exp run` in the same workspace writes its `-S` values into params.yaml while
    the first one trains: the first run's outputs would be recorded by DVC under params it was
    not trained with. Comments and formatting may change; values may not.
    """
    for path, (text, then) in _HELD.items():
        try:
            if path.read_text(encoding="utf-8") == text:
                continue
            now: Params | str = load_params(path)
        except RarelmError as exc:
            now = str(exc)
        if now == then:
            continue
        what = (f"{now}" if isinstance(now, str) else
                "{}: {!r} -> {!r}".format(*_first_difference(then, now)))
        raise RarelmError(
            f"params file {path} changed while this run was going ({what}); its outputs are not "
            "saved and the previous ones stay. To run experiments side by side use "
            "`dvc exp run --queue` (then `dvc queue start`) or separate clones; put the params back "
            "and re-run (training resumes from its last checkpoint)")


def _first_difference(a: Params, b: Params) -> tuple[str, Any, Any]:
    """The first key (dotted) whose value differs, with both values.

    >>> _first_difference(Params(), Params.from_dict({"train": {"lr": 0.5}}))
    ('train.lr', 0.003, 0.5)
    """
    def flat(node: Any, prefix: str = "") -> dict[str, Any]:
        if not isinstance(node, dict):
            return {prefix.rstrip("."): node}
        return {k: v for name, child in node.items() for k, v in flat(child, f"{prefix}{name}.").items()}

    old, new = flat(dataclasses.asdict(a)), flat(dataclasses.asdict(b))
    key = next((k for k in old if old[k] != new.get(k)), "?")
    return key, old.get(key), new.get(key)
