"""Faults and bad input: each test asserts that nothing is lost (docs/reliability.md lists them).

A full disk is simulated portably, without root or a tmpfs: the stage runs in a subprocess whose
RLIMIT_FSIZE is tiny and which ignores SIGXFSZ, so its writes fail with the kernel's own EFBIG
("File too large"), as they would fail with ENOSPC on a full disk.
"""

from __future__ import annotations

import hashlib
import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import BIN, set_params, stage


def tree_digest(*paths: Path) -> dict[str, str]:
    """{file: sha256} of every file under the given files/folders (missing ones left out)."""
    out = {}
    for root in paths:
        files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
        for f in files:
            out[str(f)] = hashlib.sha256(f.read_bytes()).hexdigest()
    return out


def assert_one_line_error(result: subprocess.CompletedProcess, *needles: str) -> str:
    assert result.returncode != 0, result.stdout
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def run_with_file_size_limit(args: list[str], cwd: Path, limit_bytes: int) -> subprocess.CompletedProcess:
    def limit() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a failing write, not a killed process
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, limit_bytes))

    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, preexec_fn=limit,
                          timeout=300)


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if ".tmp-" in p.name or ".old-" in p.name)


@pytest.mark.parametrize("name", ["prepare", "tokenize"])
def test_full_disk_while_writing_outputs_keeps_previous_outputs(repo, name):
    stage("prepare", repo, check=True)
    if name == "tokenize":
        stage("tokenize", repo, check=True)
    outputs = {"prepare": [repo / "data/prepared", repo / "metrics/prepare.json"],
               "tokenize": [repo / "data/tokenized", repo / "metrics/tokenize.json"]}[name]
    before = tree_digest(*outputs)
    # params that would change every output, then a disk that fills up half-way
    set_params(repo, seed=7, **{"tokenizer.vocab_size": 600})
    result = run_with_file_size_limit([sys.executable, "-m", f"stages.{name}"], repo, 16 * 1024)
    assert_one_line_error(result, f"rarelm {name}: error: cannot write outputs", "File too large")
    assert result.returncode == 2
    assert tree_digest(*outputs) == before, "previous outputs changed"
    assert leftovers(repo / "data") == [] and leftovers(repo / "metrics") == []
    if name == "prepare":  # with space again, the same command succeeds
        stage(name, repo, check=True)
        assert tree_digest(*outputs) != before
