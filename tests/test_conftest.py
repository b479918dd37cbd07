"""tests/conftest.py's slow lane: every file, fixture and test its lists name exists (a renamed one
would quietly move its minutes into `make test-fast`)."""

from __future__ import annotations

import ast

from tests import conftest
from tests.conftest import REPO


def names_in(path) -> set[str]:
    """The functions defined at the top level of a test file (tests and fixtures)."""
    tree = ast.parse((REPO / path).read_text(encoding="utf-8"))
    return {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}


def test_every_slow_name_exists():
    for path in conftest.SLOW_FILES:
        assert (REPO / path).is_file(), path
    shared = names_in("tests/conftest.py")  # `repo`, `tiny_raw`, ...
    for path, fixtures in conftest.SLOW_FIXTURES.items():
        assert fixtures <= names_in(path) | shared, (path, fixtures - names_in(path) - shared)
    for nodeid in conftest.SLOW_TESTS:
        path, name = nodeid.split("::")
        assert name in names_in(path), nodeid


def test_slow_lane_by_file_fixture_and_name():
    assert conftest.is_slow("tests/test_pipeline.py::test_anything", [])
    assert conftest.is_slow("tests/test_headline.py::test_the_rounds_run_the_plan", ["repo"])
    assert not conftest.is_slow("tests/test_headline.py::test_plan_rules", ["tmp_path"])
    assert not conftest.is_slow("tests/test_security.py::test_x", ["repo"])  # repo is slow per file
    assert conftest.is_slow("tests/test_train.py::test_gpu_check_falls_back_to_cpu_without_a_gpu", [])
