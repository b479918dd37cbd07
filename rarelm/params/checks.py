"""How params.yaml is read and each value checked: DVC's YAML reading, one field's type and range,
a section built from its mapping with unknown keys refused. The sections themselves are in
sections.py; what a stage calls is in __init__.py.
"""

from __future__ import annotations

import dataclasses
import math
import re
import reprlib
import types
import typing
from pathlib import Path
from typing import Any, Literal

from rarelm.errors import RarelmError

SEED_MAX = 2**32 - 1  # seeds: what numpy's RandomState takes
INT_MAX = 2**63 - 1  # any other integer: what fits the int64 of numpy and torch


def param(default: Any, *, ge: float | None = None, gt: float | None = None,
          le: float | None = None, lt: float | None = None) -> Any:
    """A dataclass field with an optional numeric range, checked on load."""
    bounds = {k: v for k, v in {"ge": ge, "gt": gt, "le": le, "lt": lt}.items() if v is not None}
    if isinstance(default, (list, dict)):
        return dataclasses.field(default_factory=lambda: type(default)(default), metadata=bounds)
    return dataclasses.field(default=default, metadata=bounds)


def read_yaml(text: str, path: str | Path = "params.yaml") -> Any:
    """YAML text as DVC reads params.yaml: ruamel.yaml's safe loader, YAML 1.2, a key given twice
    refused. PyYAML reads YAML 1.1, where `010` is 8 (DVC: 10), `1e3` and `5e-4` strings, `yes`
    and `on` booleans, `1:20` is 80, and the last of two `train:` sections wins (DVC refuses
    the file): a stage then trained with values other than those the experiment records.

    >>> read_yaml("train:\\n  max_steps: 010\\n  lr: 5e-4\\n")
    {'train': {'max_steps': 10, 'lr': 0.0005}}
    >>> read_yaml("train: {lr: 1}\\nalpha: 0\\ntrain: {lr: 2}\\n")
    Traceback (most recent call last):
    rarelm.errors.RarelmError: params file params.yaml: key "train" appears twice (again at line 3); ...
    """
    from ruamel.yaml import YAML  # DVC's own YAML library (and its reader's settings)
    from ruamel.yaml.constructor import DuplicateKeyError
    from ruamel.yaml.error import MarkedYAMLError, YAMLError

    try:
        return YAML(typ="safe").load(text)
    except DuplicateKeyError as exc:
        key = re.search(r'found duplicate key "(.*?)" with value', str(exc.problem))
        raise RarelmError(
            f"params file {path}: key \"{key.group(1) if key else '?'}\" appears twice (again at "
            f"line {exc.problem_mark.line + 1}); keep one: DVC refuses such a file and a stage "
            "would read only one of them") from None
    except MarkedYAMLError as exc:
        where = f" (line {exc.problem_mark.line + 1})" if exc.problem_mark else ""
        raise RarelmError(f"params file {path} is not valid YAML{where}: "
                          f"{exc.problem or exc.context}") from None
    except YAMLError as exc:
        raise RarelmError(f"params file {path} is not valid YAML: {exc}") from None


def build(cls: type, raw: Any, prefix: str) -> Any:
    section = prefix.rstrip(".") or "params.yaml"
    if not isinstance(raw, dict):
        raise RarelmError(f"params: {section} = {shown(raw)} is not allowed (must be a mapping)")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(raw) - set(fields))
    if unknown:
        raise RarelmError(
            f"params: unknown key {prefix}{unknown[0]} (allowed in {section}: {', '.join(fields)})")
    hints = typing.get_type_hints(cls)
    values = {}
    for name, value in raw.items():
        key = prefix + name
        hint = hints[name]
        if dataclasses.is_dataclass(hint):
            values[name] = build(hint, value, key + ".")
        else:
            values[name] = _check_value(key, value, hint, fields[name].metadata)
    return cls(**values)


def shown(value: Any, limit: int = 300) -> str:
    """repr(value), bounded in depth and length: a value built of YAML aliases ("billion laughs")
    is shared, not copied, on load, but its full repr in a message would be gigabytes."""
    short = reprlib.Repr()
    short.maxlevel, short.maxlist, short.maxdict, short.maxtuple = 2, 4, 4, 4
    short.maxstring = short.maxother = short.maxlong = limit
    text = short.repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


_EXPONENT_ONLY = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")  # 5e-4, 1E3: no dot, so a string


def _check_value(key: str, value: Any, hint: Any, bounds: Any) -> Any:
    given = value

    def reject(allowed: str) -> typing.NoReturn:
        raise RarelmError(f"params: {key} = {shown(given)} is not allowed (must be {allowed})")

    origin = typing.get_origin(hint)
    if origin is Literal:
        choices = typing.get_args(hint)
        if isinstance(value, bool) and str(value).lower() in choices:
            value = str(value).lower()  # YAML (and `dvc exp run -S k=false`) reads false as a bool
        if value not in choices:
            reject("one of " + ", ".join(map(str, choices)))
        return value
    if origin is list:
        (item,) = typing.get_args(hint)
        if not isinstance(value, list) or not all(isinstance(v, item) for v in value):
            reject(f"a list of {item.__name__}")
        return list(value)
    if hint is bool:
        if not isinstance(value, bool):
            reject("true or false")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            reject("an integer")
        if abs(value) > INT_MAX:
            reject(f"an integer of at most {INT_MAX}")
    elif hint is float:
        if isinstance(value, str) and _EXPONENT_ONLY.fullmatch(value.strip()):
            value = float(value)  # YAML 1.1 (PyYAML, `dvc exp run -S lr=5e-4`) reads 5e-4 as a string
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            reject("a number")
        try:
            value = float(value)
        except OverflowError:  # an integer past 1.8e308
            reject("a finite number")
        if not math.isfinite(value):
            reject("a finite number")
    elif hint is str:
        if value is None:
            value = ""
        if not isinstance(value, str):
            reject("a string")
    elif isinstance(hint, types.UnionType):  # pragma: no cover - no such field yet
        reject(str(hint))
    for op, limit in bounds.items():
        ok = {"ge": value >= limit, "gt": value > limit, "le": value <= limit, "lt": value < limit}[op]
        if not ok:
            sign = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<"}[op]
            reject(f"{sign} {limit:g}" if isinstance(limit, float) else f"{sign} {limit}")
    return value
