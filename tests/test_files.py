"""rarelm/files.py: atomic writers."""

import os
import re

import pytest

from rarelm.errors import RarelmError
from rarelm.files import read_input, write_csv


def test_write_csv_writes_the_plots_format(tmp_path):
    path = tmp_path / "plots" / "train.csv"
    rows = [{"step": 0, "loss": 2.0 / 3, "val_ce": None, "lr": 1e-4},
            {"step": 10, "loss": float("nan"), "lr": 123456789.0}]
    write_csv(path, ["step", "loss", "val_ce", "lr"], rows)
    assert path.read_bytes() == b"step,loss,val_ce,lr\n0,0.666667,,0.0001\n10,,,1.23457e+08\n"
    assert not list(path.parent.glob(".*"))  # no temporary file left beside it


def test_write_csv_keeps_cells_as_given_and_quotes_commas(tmp_path):
    path = tmp_path / "weights.csv"
    write_csv(path, ["log10_weight", "samples"], [{"log10_weight": -1.234567, "samples": 3}], cell=str)
    assert path.read_text() == "log10_weight,samples\n-1.234567,3\n"
    write_csv(path, ["band", "terms"], [{"band": "2,3", "terms": 1}])
    assert path.read_text() == 'band,terms\n"2,3",1\n'


def test_write_csv_leaves_the_old_file_when_rows_fail(tmp_path):
    path = tmp_path / "x.csv"
    path.write_text("old\n")

    def rows():
        yield {"a": 1}
        raise ValueError("half-way")

    with pytest.raises(ValueError):
        write_csv(path, ["a"], rows())
    assert path.read_text() == "old\n"


def _outputs(tmp_path, model: str, metrics: dict, curve: str) -> None:
    """A stage's three outputs, written as one transaction."""
    from rarelm.files import atomic_dir, atomic_file, outputs_together, write_json

    with outputs_together():
        with atomic_dir(tmp_path / "model") as tmp:
            (tmp / "weights").write_text(model)
        write_json(tmp_path / "train.json", metrics)
        with atomic_file(tmp_path / "train.csv") as f:
            f.write(curve)


def _state(tmp_path) -> dict:
    return {p.relative_to(tmp_path).as_posix(): p.read_text() if p.is_file() else "<folder>"
            for p in sorted(tmp_path.rglob("*"))}


def test_outputs_together_all_change_or_none(tmp_path):
    _outputs(tmp_path, "w1", {"step": 1}, "c1")
    assert _state(tmp_path) == {"model": "<folder>", "model/weights": "w1", "train.csv": "c1",
                                "train.json": '{\n  "step": 1\n}\n'}
    (tmp_path / "train.csv").unlink()
    (tmp_path / "train.csv").mkdir()  # the last output blocked: the first two are not put in place
    with pytest.raises(IsADirectoryError) as caught:
        _outputs(tmp_path, "w2", {"step": 2}, "c2")
    assert caught.value.filename == str(tmp_path / "train.csv")
    assert _state(tmp_path) == {"model": "<folder>", "model/weights": "w1", "train.csv": "<folder>",
                                "train.json": '{\n  "step": 1\n}\n'}
    (tmp_path / "train.csv").rmdir()
    (tmp_path / "model").rename(tmp_path / "m")
    (tmp_path / "model").write_text("mine")  # a file where the folder goes: refused, kept
    with pytest.raises(FileExistsError):
        _outputs(tmp_path, "w2", {"step": 2}, "c2")
    assert (tmp_path / "model").read_text() == "mine" and not (tmp_path / "train.csv").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m", "model", "train.json"]


def test_outputs_together_puts_back_what_it_moved_when_a_rename_fails(tmp_path, monkeypatch):
    import os

    import rarelm.files

    _outputs(tmp_path, "w1", {"step": 1}, "c1")
    before = _state(tmp_path)
    rename = os.rename

    def failing(src, dst):  # the last target's rename fails (EACCES), once
        if str(dst) == str(tmp_path / "train.csv") and ".tmp-" in str(src):
            raise PermissionError(13, "Permission denied", str(src))
        rename(src, dst)

    monkeypatch.setattr(rarelm.files.os, "rename", failing)
    with pytest.raises(PermissionError) as caught:
        _outputs(tmp_path, "w2", {"step": 2}, "c2")
    assert caught.value.filename == str(tmp_path / "train.csv")  # the target, not the temporary
    assert _state(tmp_path) == before  # the model and metrics put back, nothing left beside them
    monkeypatch.undo()
    _outputs(tmp_path, "w2", {"step": 2}, "c2")
    assert _state(tmp_path)["model/weights"] == "w2" and _state(tmp_path)["train.csv"] == "c2"


# ------------------------------------------------------------------ inputs a param names (issue 56 rows 8, 9)


def test_read_input_refuses_what_is_no_regular_file_or_too_big_before_reading(tmp_path):
    """A named pipe nobody writes (opening it for reading would block), /dev/zero (an endless
    read), a folder, a file past the limit: one RarelmError each, before any byte is read."""
    os.mkfifo(tmp_path / "pipe")
    (tmp_path / "folder").mkdir()
    (tmp_path / "big.txt").write_bytes(b"x" * 11)
    (tmp_path / "ok.txt").write_bytes(b"x" * 10)
    for path, what in [(tmp_path / "pipe", "is a named pipe (FIFO), not a file"),
                       ("/dev/zero", "is a character device, not a file"),
                       (tmp_path / "folder", "is a folder, not a file")]:
        with pytest.raises(RarelmError, match=re.escape(f"eval.general_text: {path} {what}; point it at")):
            read_input("eval.general_text", path, limit=10)
    with pytest.raises(RarelmError, match=re.escape(f"train.replay_text: {tmp_path / 'big.txt'} is 11 bytes, "
                                                    "larger than the 10 bytes a stage reads whole")):
        read_input("train.replay_text", tmp_path / "big.txt", limit=10)
    assert read_input("train.replay_text", tmp_path / "ok.txt", limit=10) == b"x" * 10
    with pytest.raises(FileNotFoundError):  # the caller names what is missing
        read_input("rare.glossary", tmp_path / "none.txt")


def test_an_input_that_leads_out_of_the_repository_is_read_with_one_warning(tmp_path, monkeypatch, capsys):
    from rarelm.errors import user_errors

    repo, outside = tmp_path / "repo", tmp_path / "outside.txt"
    (repo / "data").mkdir(parents=True)
    outside.write_text("secret\n")
    (repo / "data" / "inside.txt").write_text("term\n")
    (repo / "data" / "link.txt").symlink_to(outside)
    monkeypatch.chdir(repo)
    monkeypatch.delenv("DVC_ROOT", raising=False)
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    with user_errors("rare_terms"):
        for _ in range(2):  # once per process and path
            assert read_input("rare.glossary", "data/link.txt") == b"secret\n"
        read_input("rare.glossary", "../outside.txt")
        read_input("rare.glossary", outside)  # absolute: named outside on purpose
        read_input("rare.glossary", "data/inside.txt")
        read_input("rare.glossary", repo / "data" / "inside.txt")
    assert capsys.readouterr().err.splitlines() == [
        f"rarelm rare_terms: warning: rare.glossary: data/link.txt lies outside the repository (it leads to "
        f"{outside}); reading it: what it holds goes into this stage's outputs",
        "rarelm rare_terms: warning: rare.glossary: ../outside.txt lies outside the repository; reading "
        "it: what it holds goes into this stage's outputs"]
    monkeypatch.setenv("DVC_ROOT", str(tmp_path))  # a queued copy under the workspace's .dvc/tmp/exps
    read_input("corpus.reference_glossary", "../outside.txt")
    assert capsys.readouterr().err == ""


def test_stale_folders_of_gone_processes_are_removed_and_others_kept(tmp_path):
    """A launcher killed with SIGKILL leaves /tmp/rarelm-train-errors-<pid>-*; the next removes it."""
    import subprocess

    from rarelm.files import remove_stale_folders

    gone = subprocess.Popen(["true"])
    gone.wait()  # its pid names no process now (reaped)
    (tmp_path / f"rarelm-train-errors-{gone.pid}-abc").mkdir()
    (tmp_path / f"rarelm-train-errors-{gone.pid}-abc" / "rank-1").write_text("a line\n")
    (tmp_path / f"rarelm-train-errors-{os.getpid()}-def").mkdir()  # a running launcher's
    (tmp_path / "rarelm-train-errors-old").mkdir()  # no pid in its name: whose, unknown
    (tmp_path / f"rarelm-train-errors-{gone.pid}-link").symlink_to(tmp_path / "rarelm-train-errors-old")
    assert remove_stale_folders(tmp_path, "rarelm-train-errors-") == [
        tmp_path / f"rarelm-train-errors-{gone.pid}-abc"]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([
        f"rarelm-train-errors-{os.getpid()}-def", "rarelm-train-errors-old",
        f"rarelm-train-errors-{gone.pid}-link"])
