"""Security: no shell interpolation of user strings, loopback-only UI, no unsafe deserialisation.

(The container's non-root user and its password-free, loopback-only MLflow service are checked
in tests/test_container.py.)
"""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.conftest import run, set_params

REPO = Path(__file__).resolve().parents[1]
SOURCES = sorted(p for d in ("rarelm", "stages", "bench", "scripts") for p in (REPO / d).rglob("*.py"))


def _lookup(params: dict, key: str):
    node = params
    for part in key.split("."):
        node = node[part]
    return node


def test_dvc_commands_interpolate_no_string_param():
    """A `${...}` in a stage's cmd goes through the shell; only integer params may appear there."""
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    stages = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    for name, stage in stages.items():
        cmds = stage["cmd"] if isinstance(stage["cmd"], list) else [stage["cmd"]]
        for cmd in cmds:
            for key in re.findall(r"\$\{\s*([^}]+?)\s*\}", cmd):
                value = _lookup(params, key)
                assert isinstance(value, int) and not isinstance(value, bool), (
                    f"dvc.yaml stage {name}: cmd interpolates {key} = {value!r}; a stage must read "
                    "string params from params.yaml itself")


SHELLY = "my corpus; touch pwned1.txt && $(touch pwned2.txt) `touch pwned3.txt` | touch pwned4.txt"


def _pwned(root: Path) -> list[Path]:
    return [p for p in root.rglob("pwned*.txt") if p.parent.name != "raw"]


def test_corpus_path_with_shell_metacharacters_is_a_literal_path(repo):
    """dvc.yaml passes corpus.path only as a dependency path; the stage opens it as a file name."""
    raw = repo / "data/raw"
    shutil.copy(raw / "demo_en.txt.gz", raw / f"{SHELLY}.txt.gz")
    set_params(repo, **{"corpus.path": f"data/raw/{SHELLY}.txt.gz"})
    result = run(["dvc", "repro", "prepare"], repo)
    assert result.returncode == 0, result.stdout + result.stderr
    stats = yaml.safe_load((repo / "metrics/prepare.json").read_text())
    assert stats["documents"] > 0
    assert _pwned(repo) == []
    # the same name that does not exist: the check stage stops on it, naming it; nothing runs
    set_params(repo, **{"corpus.path": f"data/raw/{SHELLY}.jsonl"})
    missing = run(["dvc", "repro", "prepare"], repo)
    assert missing.returncode != 0 and "pwned" in missing.stderr  # named as a path in the error
    assert _pwned(repo) == []
    # and the stage itself, outside DVC: a one-line "no such file" error
    direct = run(["python", "-m", "stages.prepare"], repo)
    assert direct.returncode == 2 and "no such file or folder" in direct.stderr
    assert len(direct.stderr.strip().splitlines()) == 1
    assert _pwned(repo) == []


def test_make_ui_binds_loopback_only():
    dry = subprocess.run(["make", "-n", "ui"], cwd=REPO, capture_output=True, text=True, check=True)
    mlflow = [line for line in dry.stdout.splitlines() if re.search(r"\bmlflow (ui|server)\b", line)]
    assert mlflow, dry.stdout
    for line in mlflow:
        assert re.search(r"--host[ =]127\.0\.0\.1\b", line), line
    # no command of the project's own exposes a server beyond loopback
    for path in (REPO / "Makefile", REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))):
        for line in path.read_text().splitlines():
            if re.search(r"\bmlflow (ui|server)\b", line):
                assert "0.0.0.0" not in line, f"{path.name}: {line}"


def _calls(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            yield node, ast.unparse(node.func)


def _kw(call: ast.Call, name: str):
    for kw in call.keywords:
        if kw.arg == name:
            return kw.value
    return None


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(REPO)))
def test_no_unsafe_deserialisation_or_shell(path):
    """Weights as safetensors; torch.load only with weights_only=True; no pickle, no shell=True."""
    tree = ast.parse(path.read_text(), str(path))
    for call, func in _calls(tree):
        where = f"{path.relative_to(REPO)}:{call.lineno}: {ast.unparse(call)[:100]}"
        if func.endswith("torch.load"):
            flag = _kw(call, "weights_only")
            assert isinstance(flag, ast.Constant) and flag.value is True, where
        assert not re.fullmatch(r"(c?pickle|dill|joblib|marshal)\.loads?", func), where
        if func in ("np.load", "numpy.load"):
            flag = _kw(call, "allow_pickle")
            assert flag is None or isinstance(flag, ast.Constant) and flag.value is False, where
        if func.endswith("save_pretrained"):
            flag = _kw(call, "safe_serialization")
            assert flag is None or isinstance(flag, ast.Constant) and flag.value is True, where
        if func in ("yaml.load", "yaml.load_all"):
            loader = _kw(call, "Loader")
            assert loader is not None and "Safe" in ast.unparse(loader), where
        if func.startswith("subprocess.") or func in ("Popen", "run"):
            flag = _kw(call, "shell")
            assert flag is None or isinstance(flag, ast.Constant) and flag.value is False, where
        assert func not in ("os.system", "os.popen", "eval", "exec"), where
