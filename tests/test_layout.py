"""The code's shape limits, read from the source with `ast`: how long a function is, how many
parameters the evaluation's functions take, how long a module is, and that imports never go round
in a circle (function-local imports count: they run too, only later).

Worked example of the circle check (the fixture graph below): a -> b -> c -> a is one circle,
reported as its sorted members; d -> a hangs off it and is not in it.
"""

from __future__ import annotations

import ast
import collections
from pathlib import Path

import pytest

from tests.conftest import REPO

CODE = ("rarelm", "stages", "bench")
FUNCTION_LINES = 80  # one screen (DESIGN.md: the loop fits on one screen)
EVALUATE_PARAMETERS = 6  # what one evaluation shares travels in its context (rarelm/evaluate/)
MODULE_LINES = 650  # the longest, rarelm/prepare/corpora.py, holds every shipped corpus's builder
PARAMS_MODULE_LINES = 450  # rarelm/params/: one module a concern (sections, checks, loading)


def python_files(*folders: str) -> list[Path]:
    return sorted(p for folder in folders for p in (REPO / folder).rglob("*.py"))


def functions(path: Path) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    return [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


def parameter_count(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Every parameter a caller may pass, `self` and `cls` not counted.

    >>> parameter_count(ast.parse("def f(self, a, /, b, *c, d, **e): pass").body[0])
    5
    """
    a = node.args
    names = [*a.posonlyargs, *a.args]
    own = 1 if names and names[0].arg in ("self", "cls") else 0
    return len(names) - own + len(a.kwonlyargs) + (a.vararg is not None) + (a.kwarg is not None)


def where(path: Path, node: ast.AST) -> str:
    return f"{path.relative_to(REPO).as_posix()}:{node.lineno} {getattr(node, 'name', '')}"


def test_no_function_is_longer_than_one_screen():
    long = [f"{where(p, f)} ({f.end_lineno - f.lineno + 1} lines)"
            for p in python_files(*CODE) for f in functions(p)
            if f.end_lineno - f.lineno + 1 > FUNCTION_LINES]
    assert not long, long


def test_the_evaluations_functions_take_at_most_six_parameters():
    wide = [f"{where(p, f)} ({parameter_count(f)})" for p in python_files("rarelm/evaluate")
            for f in functions(p) if parameter_count(f) > EVALUATE_PARAMETERS]
    assert not wide, wide


def test_modules_stay_readable_top_to_bottom():
    lengths = {p: p.read_text(encoding="utf-8").count("\n") for p in python_files("rarelm", "stages")}
    assert not [p for p, n in lengths.items() if n > MODULE_LINES], MODULE_LINES
    params = {p.name: n for p, n in lengths.items() if p.parent == REPO / "rarelm/params"}
    assert set(params) == {"__init__.py", "checks.py", "sections.py"}
    assert max(params.values()) < PARAMS_MODULE_LINES, params


def module_names(root: Path = REPO, package: str = "rarelm") -> dict[str, Path]:
    """Dotted module name -> its file, a package named by its __init__.py."""
    out = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the modules of the same package its import statements name, anywhere in the file;
    `from m import x` names m.x where that is a module, else m."""
    edges: dict[str, set[str]] = collections.defaultdict(set)
    for name, path in modules.items():
        here = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                named = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = (here[: len(here) - node.level + 1] if node.level else []) + (
                    node.module.split(".") if node.module else [])
                named = [".".join([*base, a.name]) if ".".join([*base, a.name]) in modules
                         else ".".join(base) for a in node.names]
            else:
                continue
            edges[name] |= {m for m in named if m in modules and m != name}
    return edges


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The graph's circles: its strongly connected components of two or more (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = stack[stack.index(v):]
            del stack[stack.index(v):]
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_the_circle_check_finds_a_circle(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg import b\n")
    (pkg / "b.py").write_text("def f():\n    from . import c\n")  # function-local counts
    (pkg / "c.py").write_text("import pkg.a\n")
    (pkg / "d.py").write_text("from pkg.a import thing\n")
    graph = import_graph(module_names(tmp_path, "pkg"))
    assert graph["pkg.d"] == {"pkg.a"} and graph["pkg.b"] == {"pkg.c"}
    assert circles(graph) == [["pkg.a", "pkg.b", "pkg.c"]]


@pytest.mark.parametrize("level", ["module", "package"])
def test_no_import_circle_in_rarelm(level):
    """Between modules, and between rarelm's subpackages (rarelm/train -> rarelm/evaluate ->
    rarelm/train would be a circle even where no two modules form one): the floors have no arrow
    back up."""
    graph = import_graph(module_names())
    if level == "package":
        floor = {name: ".".join(name.split(".")[:2]) for name in graph.keys() | set().union(*graph.values())}
        merged: dict[str, set[str]] = collections.defaultdict(set)
        for name, targets in graph.items():
            merged[floor[name]] |= {floor[t] for t in targets if floor[t] != floor[name]}
        graph = merged
    assert circles(graph) == []
