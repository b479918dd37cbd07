"""stages/cli.py: the `rarelm` console script's own behaviour (each subcommand has its own tests)."""

from __future__ import annotations

import re

import pytest

from tests.conftest import BIN, run, stage

USAGE_ERRORS = [
    (["generate", "--max-new-tokens", "-1", "x"], "rarelm generate: error: No such option: --max-new-tokens "
     "(Possible options: --max-tokens) (see rarelm generate --help)"),
    (["compare", "a", "b"], "rarelm compare: error: Missing option '--baseline' / '-b'. "
     "(see rarelm compare --help)"),
    (["champion", "-1"], "rarelm champion: error: No such option: -1 (see rarelm champion --help)"),
    (["generate", "--max-tokens", "many", "x"], "rarelm generate: error: Invalid value for '--max-tokens': "
     "Input should be a valid integer, unable to parse string as an integer (see rarelm generate --help)"),
    (["nosuch"], "rarelm: error: No such command 'nosuch'. (see rarelm --help)"),
]


@pytest.mark.parametrize(("args", "line"), USAGE_ERRORS, ids=["unknown-option", "missing-option",
                                                             "negative-number", "bad-value", "no-command"])
def test_a_usage_error_is_one_line(tmp_path, args, line):
    """Was: the usage line, a hint and a 3-line box (5 lines) for each."""
    result = run([str(BIN / "rarelm"), *args], tmp_path)
    assert (result.returncode, result.stdout, result.stderr) == (2, "", line + "\n")
    assert list(tmp_path.iterdir()) == []


def test_help_and_version_are_unchanged(tmp_path):
    bare = run([str(BIN / "rarelm")], tmp_path)
    assert "Usage: rarelm [OPTIONS] COMMAND [ARGS]..." in bare.stdout + bare.stderr
    assert "error" not in bare.stdout + bare.stderr
    helped = run([str(BIN / "rarelm"), "compare", "--help"], tmp_path)
    assert helped.returncode == 0 and "--baseline" in helped.stdout and helped.stderr == ""
    version = run([str(BIN / "rarelm"), "--version"], tmp_path)
    assert version.returncode == 0 and re.fullmatch(r"rarelm \d+\.\d+\.\d+\n", version.stdout)


def test_the_out_of_memory_advice_for_generate_names_its_option():
    """Was: "lower --max-new-tokens", an option generate does not have."""
    import typer

    from rarelm.errors import memory_error
    from stages.cli import app

    options = {name for param in typer.main.get_command(app).commands["generate"].params
               for name in param.opts}
    advice = memory_error(MemoryError(), "generate")
    named = set(re.findall(r"--[a-z-]+", advice))
    assert named == {"--max-tokens"} and named <= options, advice


def test_tokenize_writes_nothing_on_stderr_when_it_succeeds(repo):
    """Was: one blank line (the transient progress bar, stopped where stderr is no terminal)."""
    stage("prepare", repo, check=True)
    result = stage("tokenize", repo, check=True)
    assert result.stderr == ""
    assert result.stdout.startswith("tokenize: vocabulary 512 (bpe), tokens: train ")
