"""Folders are layers and imports point down (README: where things live):

    streamrl/                     the app: CLI, local orchestration, reports, recovery
    producers/ consumers/ learner/   the components: talk only through topics
    algos/                        the RL maths, in registries
    runtime/                      settings, bus, database, typed recipe, plugins, ...
    schema/                       the contracts: events, codec, topics, ledger tables

Every import of every module (function-level ones included) is read from the source."""

import ast
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PROJECT = ("schema", "runtime", "algos", "producers", "consumers", "learner", "streamrl", "migrations", "recipes")
MAY_IMPORT = {
    "schema": {"schema"},
    "runtime": {"runtime", "schema"},
    "algos": {"algos", "runtime", "schema"},
    "producers": {"producers", "algos", "runtime", "schema"},
    "consumers": {"consumers", "algos", "runtime", "schema"},
    "learner": {"learner", "algos", "runtime", "schema"},
    "migrations": {"migrations", "schema"},
}


def imported_packages(path: Path) -> set[tuple[str, int]]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {(alias.name.split(".")[0], node.lineno) for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add((node.module.split(".")[0], node.lineno))
    return {(name, line) for name, line in found if name in PROJECT}


def layer_violations(layer: str) -> list[str]:
    allowed = MAY_IMPORT[layer]
    return [f"{path.relative_to(REPO)}:{line} imports {name}"
            for path in sorted((REPO / layer).rglob("*.py"))
            for name, line in sorted(imported_packages(path)) if name not in allowed]


@pytest.mark.parametrize("layer", sorted(MAY_IMPORT))
def test_imports_point_down(layer):
    assert layer_violations(layer) == []


def test_the_checker_sees_an_upward_import(tmp_path, monkeypatch):
    (tmp_path / "runtime").mkdir()
    (tmp_path / "runtime" / "bad.py").write_text("def f():\n    from learner.loop import Learner\n")
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    assert layer_violations("runtime") == ["runtime/bad.py:2 imports learner"]


def test_no_module_is_much_over_400_lines():
    long = [f"{p.relative_to(REPO)}: {n} lines" for layer in PROJECT for p in (REPO / layer).rglob("*.py")
            if (n := len(p.read_text().splitlines())) > 420]
    assert long == []
