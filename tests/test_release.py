"""rarelm release: the git tag DVC's artifacts convention needs, checked through `dvc artifacts get`."""

from __future__ import annotations

import subprocess

import pytest

from rarelm.tracking.release import tag_name
from tests.conftest import run


def git(root, *args):
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=root,
                          check=True, capture_output=True, text=True).stdout


def test_release_tags_the_model_that_dvc_artifacts_get_downloads(tmp_path, monkeypatch):
    """A tiny DVC repo with the model as the artifact `rarelm`, a local folder as its default
    remote, as README says: release, push, then get it from the repo by name, in another folder."""
    from typer.testing import CliRunner

    from stages.cli import app

    repo = tmp_path / "repo"
    (repo / "models/model").mkdir(parents=True)
    (repo / "models/model/config.json").write_text('{"n_positions": 8}')
    (repo / "models/model/model.safetensors").write_bytes(b"weights")
    (repo / "dvc.yaml").write_text("artifacts:\n  rarelm:\n    path: models/model\n    type: model\n")
    git(repo, "init", "-q")
    for command in (["dvc", "init", "-q"], ["dvc", "add", "-q", "models/model"],
                    ["dvc", "remote", "add", "-d", "storage", str(tmp_path / "storage")]):
        run(command, repo, check=True)
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "model")
    monkeypatch.chdir(repo)
    cli = CliRunner()

    result = cli.invoke(app, ["release", "v1.0.0"])
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("release: tagged rarelm@v1.0.0; `dvc push` uploads the model to the "
                                    "default DVC remote `storage`")
    assert git(repo, "cat-file", "-t", "rarelm@v1.0.0").strip() == "tag"  # annotated, as GTO's
    run(["dvc", "push", "-q"], repo, check=True)
    got = run(["dvc", "artifacts", "get", str(repo), "rarelm", "-o", "got"], tmp_path, check=True)
    assert "Downloaded 2 file(s)" in got.stdout + got.stderr
    assert (tmp_path / "got/model.safetensors").read_bytes() == b"weights"
    run(["dvc", "artifacts", "get", str(repo), "rarelm", "--rev", "v1.0.0", "-o", "v1"], tmp_path, check=True)
    assert (tmp_path / "v1/config.json").read_text() == '{"n_positions": 8}'

    (repo / "dvc.yaml").write_text((repo / "dvc.yaml").read_text() + "    desc: changed\n")
    for args, message in ((["release", "v1.0.0"], "tag rarelm@v1.0.0 already exists"),
                          (["release", "1.0"], "version '1.0' is not allowed (must be vMAJOR.MINOR.PATCH"),
                          (["release", "v1.1.0"], "dvc.yaml has uncommitted changes")):
        result = cli.invoke(app, args)
        assert result.exit_code == 2 and result.stderr.startswith(f"rarelm release: error: {message}"), \
            result.output
        assert len(result.stderr.strip().splitlines()) == 1
    assert git(repo, "tag").split() == ["rarelm@v1.0.0"]


@pytest.mark.parametrize("version,tag", [("v2.0.1", "rarelm@v2.0.1"), ("2.0.1", "rarelm@v2.0.1")])
def test_tag_name_follows_gto(version, tag):
    assert tag_name("rarelm", version) == tag


def test_an_artifact_that_dvc_yaml_does_not_declare_is_refused_and_no_name_is_an_option(tmp_path,
                                                                                         monkeypatch):
    """Issue 56 row 14: `rarelm release --artifact nosuch v1.0.0` made a tag for an artifact that
    dvc.yaml does not declare; `--artifact -d` reached git where its options go. Now the name must
    be one dvc.yaml declares, and the tag goes after git's `--`: even a declared name starting with
    '-' (DVC itself would not take it) is a tag name to git, which refuses it as one."""
    from typer.testing import CliRunner

    from stages.cli import app

    (tmp_path / "dvc.yaml").write_text("artifacts:\n  rarelm:\n    path: models/model\n")
    git(tmp_path, "init", "-q")
    git(tmp_path, "add", "-A")
    git(tmp_path, "commit", "-qm", "model")
    monkeypatch.chdir(tmp_path)
    for args, message in (
            (["release", "--artifact", "nosuch", "v1.0.0"], "--artifact 'nosuch': dvc.yaml declares no such "
             "artifact (declared: rarelm)"),
            (["release", "--artifact", "-d", "v1.0.0"],
             "--artifact '-d': dvc.yaml declares no such artifact")):
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 2 and result.stderr.startswith(f"rarelm release: error: {message}"), \
            result.output
    (tmp_path / "dvc.yaml").write_text("artifacts:\n  -d:\n    path: models/model\n")
    git(tmp_path, "commit", "-qam", "a name DVC would refuse")
    result = CliRunner().invoke(app, ["release", "--artifact", "-d", "v1.0.0"])
    assert result.exit_code == 2
    assert result.stderr.strip() == ("rarelm release: error: git tag -d@v1.0.0 failed: fatal: '-d@v1.0.0' is "
                                     "not a valid tag name.")
    assert git(tmp_path, "tag") == ""
