"""`dvc exp apply` exits 0 in a clone that never ran the sub-pipelines (base/, smollm2/).

`dvc exp apply` checks out the cached outputs of every dvc.yaml in the repo, not only the main
pipeline's. A sub-pipeline's cached output that no cache holds (base/data/*: built only by `make
base`) made it exit 255 ("Checkout failed ... base/data/*") after it had applied the experiment.
So the sub-pipelines declare every output `cache: false`.
"""

from __future__ import annotations

import pytest
import yaml

from tests.conftest import REPO, run


def sub_pipelines() -> list:
    """Every dvc.yaml of the repo but the main one (git-tracked or not yet)."""
    return sorted(p for p in REPO.glob("*/dvc.yaml") if p.parent.name not in {".dvc", ".venv"})


def cached_outputs(dvc_yaml) -> list[str]:
    """The outputs of a dvc.yaml that DVC caches (and `dvc exp apply` checks out)."""
    stages = yaml.safe_load(dvc_yaml.read_text(encoding="utf-8")).get("stages", {})
    found = []
    for name, stage in stages.items():
        for kind in ("outs", "metrics", "plots"):
            for out in stage.get(kind, []):
                path, opts = (out, {}) if isinstance(out, str) else next(iter(out.items()))
                if (opts or {}).get("cache", True):
                    found.append(f"{name}: {path}")
    return found


def test_sub_pipelines_cache_nothing():
    assert "base/dvc.yaml" in [p.relative_to(REPO).as_posix() for p in sub_pipelines()]
    assert {p.relative_to(REPO).as_posix(): cached_outputs(p) for p in sub_pipelines()} == {
        p.relative_to(REPO).as_posix(): [] for p in sub_pipelines()}


@pytest.mark.slow
@pytest.mark.parametrize(("sub_cache", "applies"), [(True, False), (False, True)])
def test_exp_apply_in_a_clone_that_never_ran_the_sub_pipeline(tmp_path, sub_cache, applies):
    """The failure and the fix on a two-pipeline repo: an experiment of the main one, applied in a
    clone where the sub-pipeline's output is in no cache."""
    src, clone = tmp_path / "src", tmp_path / "clone"
    (src / "sub").mkdir(parents=True)
    (src / "params.yaml").write_text("x: 1\n")
    (src / "dvc.yaml").write_text("stages:\n  main:\n    cmd: python -c \"import yaml; open('a.txt', 'w')"
                                  ".write(str(yaml.safe_load(open('params.yaml'))['x']))\"\n"
                                  "    params: [x]\n    outs: [a.txt]\n")
    out = "b.txt" if sub_cache else "b.txt:\n          cache: false"
    (src / "sub/dvc.yaml").write_text(f"stages:\n  sub:\n    cmd: echo sub > b.txt\n"
                                      f"    outs:\n      - {out}\n")
    (src / "sub/.gitignore").write_text("/b.txt\n")
    for cmd in (["git", "init", "-q"], ["dvc", "init", "-q"],
                ["dvc", "repro", "-q", "dvc.yaml", "sub/dvc.yaml"], ["git", "add", "-A"],
                ["git", "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "init"]):
        run(cmd, src, check=True)
    run(["git", "clone", "-q", str(src), str(clone)], tmp_path, check=True)
    run(["git", "config", "user.email", "t@t"], clone, check=True)  # dvc exp run commits
    run(["git", "config", "user.name", "t"], clone, check=True)
    run(["dvc", "exp", "run", "-q", "-n", "e1", "-S", "x=2"], clone, check=True)
    run(["git", "checkout", "-q", "--", "."], clone, check=True)  # back to the baseline's params
    result = run(["dvc", "exp", "apply", "e1"], clone)
    assert (result.returncode == 0) is applies, result.stderr
    assert (clone / "a.txt").read_text() == "2"  # applied either way: DVC only failed to say so
    assert ("sub/b.txt" in result.stderr) is not applies
