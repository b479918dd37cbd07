"""dvc.yaml's code deps cover what each stage runs, so a code change re-runs every stage it affects.

A stage's code is the import closure of the module its `cmd` runs (`python -m stages.train`): the
files of rarelm/ and stages/ that the module imports, what those import, and so on, with
function-local and relative imports included (a parent package's __init__.py runs too). Each of
them must sit under a declared dep, a file or a folder (`rarelm/train`): a file outside the deps
changes the stage's result without DVC noticing. The check reads dvc.yaml as DVC does: deps are
relative to the stage's wdir (base/dvc.yaml's stages run in base/, so they write `../rarelm/...`).

Worked example (the fixture package below): stages/demo.py imports `pkg.a` inside main(), pkg/a.py
does `from . import b`, so the closure of `stages.demo` is pkg/__init__.py, pkg/a.py, pkg/b.py,
stages/__init__.py and stages/demo.py; with deps `[stages, pkg/a.py]` the check reports
pkg/__init__.py and pkg/b.py, with `[stages, pkg]` nothing.
"""

from __future__ import annotations

import ast
import copy
import os
import re
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO

PIPELINES = ("dvc.yaml", "base/dvc.yaml", "smollm2/dvc.yaml", "gemma3/dvc.yaml")
CORE = ("rarelm", "stages")  # the folders whose top-level files are shared core (rarelm/errors.py)


def module_file(name: str, root: Path) -> Path | None:
    """The file that `import name` runs in root (a package's __init__.py), or None outside root."""
    base = root.joinpath(*name.split("."))
    for candidate in (base / "__init__.py", base.with_suffix(".py")):
        if candidate.is_file():
            return candidate
    return None


def imported_names(path: Path, root: Path) -> list[str]:
    """Every module name an import statement of path may load, anywhere in the file (function
    bodies too), relative ones made absolute; `from m import x` yields both `m` and `m.x`, since x
    may be a submodule."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    package = parts[:-1]  # for pkg/__init__.py and pkg/mod.py alike, `from . import` means pkg
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            anchor = package[: len(package) - node.level + 1] if node.level else []
            module = anchor + ([node.module] if node.module else [])
            names += [".".join(module)] * bool(module) + [".".join(module + [a.name]) for a in node.names]
    return names


def import_closure(module: str, root: Path = REPO) -> list[str]:
    """The files under root (posix, relative to root) that `python -m module` may run."""
    seen: set[Path] = set()
    todo = [module, f"{module}.__main__"]  # `python -m package` runs its __main__.py
    while todo:
        name = todo.pop()
        prefixes = name.split(".")
        # `import a.b.c` runs a/__init__.py and a/b/__init__.py before a/b/c.py
        for end in range(1, len(prefixes) + 1):
            path = module_file(".".join(prefixes[:end]), root)
            if path is not None and path not in seen:
                seen.add(path)
                todo += imported_names(path, root)
    return sorted(p.relative_to(root).as_posix() for p in seen)


def stage_module(cmd: str | list[str]) -> str | None:
    """The module a stage's cmd runs with `python -m`, or None for a command that runs none."""
    found = re.search(r"\bpython3? -m ([\w.]+)", " ".join(cmd) if isinstance(cmd, list) else cmd)
    return found.group(1) if found else None


def declared_deps(pipeline: Path, stage: dict, root: Path = REPO) -> list[str]:
    """A stage's deps as paths relative to root (posix), resolved from its wdir as DVC does."""
    wdir = pipeline.parent / stage.get("wdir", ".")
    return [Path(os.path.relpath(os.path.normpath(wdir / dep), root)).as_posix()
            for dep in stage.get("deps", [])]


def uncovered_code(pipeline: Path, stages: dict, root: Path = REPO) -> dict[str, list[str]]:
    """Stage name -> the files of its import closure that no declared dep covers (empty: all fine)."""
    gaps = {}
    for name, stage in stages.items():
        module = stage_module(stage["cmd"])
        if module is None:
            continue
        deps = declared_deps(pipeline, stage, root)
        missing = [f for f in import_closure(module, root)
                   if not any(f == dep or f.startswith(dep + "/") for dep in deps)]
        if missing:
            gaps[name] = missing
    return gaps


def unused_code_deps(pipeline: Path, stages: dict, root: Path = REPO) -> dict[str, list[str]]:
    """Stage name -> its declared code deps (under a folder of its code: rarelm/, stages/) that hold
    no file of its import closure: a stale entry, or a folder wider than the stage needs. The shared
    core files (rarelm/*.py, stages/__init__.py) are exempt: which of them a stage reaches shifts with
    any small refactor (a function-local import in rarelm/files.py), and one too many only re-runs it."""
    unused = {}
    for name, stage in stages.items():
        module = stage_module(stage["cmd"])
        if module is None:
            continue
        closure = import_closure(module, root)
        code_dirs = {f.split("/")[0] for f in closure}  # rarelm, stages
        stale = [dep for dep in declared_deps(pipeline, stage, root) if dep.split("/")[0] in code_dirs
                 and not (dep.count("/") == 1 and dep.endswith(".py") and dep.split("/")[0] in CORE)
                 and not any(f == dep or f.startswith(dep + "/") for f in closure)]
        if stale:
            unused[name] = stale
    return unused


def _stages(pipeline: str) -> dict:
    return yaml.safe_load((REPO / pipeline).read_text(encoding="utf-8"))["stages"]


@pytest.mark.parametrize("pipeline", PIPELINES)
def test_every_stage_declares_the_code_it_imports(pipeline):
    gaps = uncovered_code(REPO / pipeline, _stages(pipeline))
    assert gaps == {}, "\n".join(f"{pipeline} stage {name}: imports {', '.join(files)} but declares no "
                                 "dep covering it (add the file, or its folder, to the stage's deps)"
                                 for name, files in gaps.items())


@pytest.mark.parametrize("pipeline", PIPELINES)
def test_every_declared_code_dep_holds_code_the_stage_imports(pipeline):
    unused = unused_code_deps(REPO / pipeline, _stages(pipeline))
    assert unused == {}, f"{pipeline}: deps that the stage never imports: {unused}"


def test_every_stage_of_the_main_pipeline_runs_a_module_of_this_repo():
    modules = {name: stage_module(stage["cmd"]) for name, stage in _stages("dvc.yaml").items()}
    assert modules == {name: f"stages.{name}" for name in
                       ("check", "prepare", "tokenize", "rare_terms", "weights", "train", "datastore",
                        "evaluate")}


def test_every_stage_of_the_main_pipeline_is_a_rarelm_subcommand():
    """`rarelm <stage>` runs each stage outside DVC (stages/cli.py), the same function as dvc.yaml's."""
    from stages.cli import app

    commands = {c.name or c.callback.__name__: c.callback for c in app.registered_commands}
    for name, stage in _stages("dvc.yaml").items():
        module = __import__(stage_module(stage["cmd"]), fromlist=[name])
        assert commands.get(name) is getattr(module, name), name


def test_removing_a_declared_folder_shows_the_files_it_covered():
    """The check fails when a folder dep goes: drop `rarelm/train` from a copy of train's deps and
    the report names exactly the closure's files under it, for train alone."""
    stages = copy.deepcopy(_stages("dvc.yaml"))
    stages["train"]["deps"].remove("rarelm/train")
    gaps = uncovered_code(REPO / "dvc.yaml", stages)
    closure = import_closure("stages.train")
    assert set(gaps) == {"train"}
    assert gaps["train"] == [f for f in closure if f.startswith("rarelm/train/")]
    assert {"rarelm/train/__init__.py", "rarelm/train/loop.py", "rarelm/train/model.py"} <= set(gaps["train"])


def test_removing_a_core_dep_is_reported_for_every_stage_that_imports_it():
    stages = copy.deepcopy(_stages("dvc.yaml"))
    for stage in stages.values():
        stage["deps"].remove("rarelm/params")
    gaps = uncovered_code(REPO / "dvc.yaml", stages)
    params = ["rarelm/params/__init__.py", "rarelm/params/checks.py", "rarelm/params/sections.py"]
    assert gaps == {name: params for name in stages}


def test_base_pipeline_deps_resolve_from_its_folder():
    stages = _stages("base/dvc.yaml")
    train_deps = declared_deps(REPO / "base/dvc.yaml", stages["train"])
    assert train_deps[:2] == ["base/params.yaml", "stages/__init__.py"]
    assert "rarelm/prepare/corpora.py" in declared_deps(REPO / "base/dvc.yaml", stages["corpus"])  # wdir: ..
    stages["train"]["deps"].remove("../rarelm/objectives")
    assert set(uncovered_code(REPO / "base/dvc.yaml", stages)) == {"train"}


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A package with a relative import, a function-local import and an unimported module."""
    files = {
        "stages/__init__.py": "",
        "stages/demo.py": "import os\n\ndef main():\n    from pkg.a import run\n    run()\n",
        "pkg/__init__.py": "",
        "pkg/a.py": "from . import b\n\ndef run():\n    return b.VALUE\n",
        "pkg/b.py": "from .. import os_free  # not in root: ignored\nVALUE = 1\n",
        "pkg/unused.py": "import pkg.a\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    return tmp_path


def test_closure_follows_function_local_and_relative_imports(root):
    assert import_closure("stages.demo", root) == ["pkg/__init__.py", "pkg/a.py", "pkg/b.py",
                                                   "stages/__init__.py", "stages/demo.py"]


def test_check_names_the_uncovered_file_and_the_unused_dep(root):
    pipeline = root / "dvc.yaml"
    stages = {"demo": {"cmd": "python -m stages.demo --flag",
                       "deps": ["stages", "pkg/a.py", "pkg/unused.py"]},
              "shell": {"cmd": "echo no python here", "deps": ["pkg"]}}
    assert uncovered_code(pipeline, stages, root) == {"demo": ["pkg/__init__.py", "pkg/b.py"]}
    assert unused_code_deps(pipeline, stages, root) == {"demo": ["pkg/unused.py"]}
    stages["demo"]["deps"].append("stages/other.py")  # a core file: exempt even where not imported
    assert unused_code_deps(pipeline, stages, root) == {"demo": ["pkg/unused.py"]}
    stages["demo"]["deps"] = ["stages", "pkg"]
    assert uncovered_code(pipeline, stages, root) == {} and unused_code_deps(pipeline, stages, root) == {}


def test_closure_of_a_package_run_with_dash_m_includes_its_main(root):
    (root / "pkg/__main__.py").write_text("from pkg import b\n")
    assert import_closure("pkg", root) == ["pkg/__init__.py", "pkg/__main__.py", "pkg/b.py"]


def test_side_pipelines_are_dvc_projects_of_their_own():
    """base/ and smollm2/ carry their own .dvc/ (`dvc init --subdir`): the main project's `dvc status`,
    `dvc exp show` and `dvc exp apply` list only dvc.yaml's stages (a fresh clone lacks the side
    pipelines' outputs, and their stages filled `dvc status` with 126 stale lines), while
    `cd base && dvc repro` (`make base`) still finds its own."""
    from tests.conftest import run

    listed = run(["dvc", "stage", "list", "--all", "--name-only"], REPO, check=True).stdout.split()
    assert listed == list(_stages("dvc.yaml"))
    for side in ("base", "smollm2", "gemma3"):
        assert (REPO / side / ".dvc/config").is_file()
        own = run(["dvc", "stage", "list", "--name-only"], REPO / side, check=True).stdout.split()
        assert own == list(_stages(f"{side}/dvc.yaml"))
        assert f"\tcd {side} && dvc repro\n" in (REPO / "Makefile").read_text(encoding="utf-8")
