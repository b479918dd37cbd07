"""rarelm/git.py on a real repository in a temporary folder."""

import pytest

from rarelm import git
from rarelm.errors import RarelmError

IDENT = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
         "GIT_COMMITTER_EMAIL": "t@t"}


@pytest.fixture
def repo(tmp_path):
    git.checked(tmp_path, "init", "-q")
    (tmp_path / "a.txt").write_text("héllo\n", encoding="utf-8")
    git.checked(tmp_path, "add", "a.txt")
    git.checked(tmp_path, "commit", "-qm", "one", env=IDENT)
    return tmp_path


def test_run_returns_the_process_with_text_or_bytes(repo):
    head = git.run(repo, "rev-parse", "HEAD")
    assert head.returncode == 0 and len(head.stdout.strip()) == 40
    assert git.run(repo, "show", "HEAD:a.txt").stdout == "héllo\n"
    assert git.run(repo, "show", "HEAD:a.txt", text=False).stdout == "héllo\n".encode()
    assert git.run(repo, "rev-parse", "--verify", "-q", "nope").returncode != 0


def test_checked_passes_stdin_and_env_and_names_the_failed_command(repo):
    blob = git.checked(repo, "hash-object", "-w", "--stdin", stdin="x\n")
    assert git.checked(repo, "cat-file", "-p", blob) == "x"
    index = repo / "other-index"
    git.checked(repo, "read-tree", "HEAD", env={"GIT_INDEX_FILE": str(index)})
    assert index.is_file()
    with pytest.raises(RarelmError, match=r"^git rev-parse --verify nope: fatal"):
        git.checked(repo, "rev-parse", "--verify", "nope")
    with pytest.raises(KeyError, match="git cat-file"):
        git.checked(repo, "cat-file", "-p", "0" * 40, error=KeyError)


def test_output_is_empty_outside_a_repository_or_without_git(repo, tmp_path_factory, monkeypatch):
    assert git.output(repo, "rev-parse", "HEAD") == git.checked(repo, "rev-parse", "HEAD")
    assert git.output(tmp_path_factory.mktemp("bare"), "rev-parse", "HEAD") == ""
    monkeypatch.setenv("PATH", "")  # no git to start
    assert git.output(repo, "rev-parse", "HEAD") == ""
    with pytest.raises(RarelmError, match="cannot run git"):
        git.run(repo, "status")
