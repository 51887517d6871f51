"""Folders are layers and imports point down (README: where things live). Every layer is
imported as `streamrl.<layer>` (the folders sit at the repository's top level and are
installed as subpackages of `streamrl`):

    streamrl/                     the app: CLI, local orchestration, reports, recovery
    producers/ consumers/ learner/ training_service/   the components: talk only through topics
                                  (the training service through its HTTP API)
    algos/                        the RL maths, in registries
    runtime/                      settings, bus, database, typed recipe, plugins, ...
    schema/                       the contracts: events, codec, topics, ledger tables

Every import of every module (function-level ones included) is read from the source."""

import ast
import io
import sys
import tokenize
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PROJECT = (
    "schema",
    "runtime",
    "algos",
    "producers",
    "consumers",
    "learner",
    "training_service",
    "streamrl",
    "migrations",
    "recipes",
)
MAY_IMPORT = {
    "schema": {"schema"},
    "runtime": {"runtime", "schema"},
    "algos": {"algos", "runtime", "schema"},
    "producers": {"producers", "algos", "runtime", "schema"},
    "consumers": {"consumers", "algos", "runtime", "schema"},
    "learner": {"learner", "algos", "runtime", "schema"},
    "training_service": {"training_service", "algos", "runtime", "schema"},
    "migrations": {"migrations", "schema"},
}


LAYERS = ("schema", "runtime", "algos", "producers", "consumers", "learner", "training_service", "migrations", "recipes")


def layer_of(module: str) -> str | None:
    """`streamrl.producers.rollout` -> producers; `streamrl.cli` -> streamrl (the app);
    a bare layer name (`producers.rollout`) -> `bare producers`; anything else -> None."""
    parts = module.split(".")
    if parts[0] == "streamrl":
        return parts[1] if len(parts) > 1 and parts[1] in LAYERS else "streamrl"
    return f"bare {parts[0]}" if parts[0] in LAYERS else None


def imported_modules(path: Path) -> set[tuple[str, int]]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {(alias.name, node.lineno) for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found |= {
                (node.module if node.module != "streamrl" else f"streamrl.{alias.name}", node.lineno) for alias in node.names
            }
    return found


def imported_packages(path: Path) -> set[tuple[str, int]]:
    return {(layer, line) for module, line in imported_modules(path) if (layer := layer_of(module)) is not None}


def layer_violations(layer: str) -> list[str]:
    allowed = MAY_IMPORT[layer]
    return [
        f"{path.relative_to(REPO)}:{line} imports {name}"
        for path in sorted((REPO / layer).rglob("*.py"))
        for name, line in sorted(imported_packages(path))
        if name not in allowed
    ]


@pytest.mark.parametrize("layer", sorted(MAY_IMPORT))
def test_imports_point_down(layer):
    assert layer_violations(layer) == []


def test_the_checker_sees_an_upward_import(tmp_path, monkeypatch):
    (tmp_path / "runtime").mkdir()
    (tmp_path / "runtime" / "bad.py").write_text("def f():\n    from streamrl.learner.loop import Learner\n")
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    assert layer_violations("runtime") == ["runtime/bad.py:2 imports learner"]


PYTHON_TREES = (*PROJECT, "tests", "bench", "contrib")


def bare_layer_imports(repo: Path) -> list[str]:
    """Imports of a layer by its folder's name (`from producers.rollout import ...`): in an
    installed StreamRL that name is another project's, or nothing."""
    return [
        f"{path.relative_to(repo)}:{line} imports {module}"
        for tree in PYTHON_TREES
        for path in sorted((repo / tree).rglob("*.py"))
        for module, line in sorted(imported_modules(path))
        if (layer_of(module) or "").startswith("bare ")
    ]


def test_every_module_imports_the_layers_under_streamrl():
    assert bare_layer_imports(REPO) == []


def test_the_namespace_check_sees_a_bare_layer_import(tmp_path):
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "b.py").write_text("import os\nfrom schema.events import Sample\nimport streamrl.schema\n")
    assert bare_layer_imports(tmp_path) == ["bench/b.py:2 imports schema.events"]


def statement_lines(text: str) -> int:
    """Non-blank lines, less those that continue a bracketed expression: a module's size
    as the formatter cannot change it (`ruff format` lays one call out on one line or on
    ten; a docstring or comment line counts either way)."""
    continued, depth = set(), 0
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type == tokenize.OP and token.string in "([{":
            depth += 1
        elif token.type == tokenize.OP and token.string in ")]}":
            depth -= 1
        elif token.type == tokenize.NL and depth > 0:
            continued.add(token.start[0] + 1)
    return sum(1 for number, line in enumerate(text.splitlines(), 1) if line.strip() and number not in continued)


# The limit was 420 physical lines before the code was formatted with `ruff format`. In
# these units the densest module then (learner/trainers.py, 405 lines) measured 334, so
# 420 of its lines were about 346: the same bound, counted as the formatter leaves it.
MODULE_LIMIT = 345


def test_no_module_is_much_over_400_lines():
    long = [
        f"{p.relative_to(REPO)}: {n} statement lines"
        for layer in PROJECT
        for p in (REPO / layer).rglob("*.py")
        if (n := statement_lines(p.read_text())) > MODULE_LIMIT
    ]
    assert long == []


def test_the_size_measure_ignores_how_a_call_is_laid_out():
    one_line = "x = f(1, 2, 3)\n"
    exploded = "x = f(\n    1,\n    2,\n    3,\n)\n"
    assert statement_lines(one_line) == statement_lines(exploded) == 1
    assert statement_lines('"""a\ndocstring"""\n# a comment\n\ny = 2\n') == 4


def module_imports(repo: Path) -> dict[str, set[str]]:
    """Every project module and the project modules it imports (function-level imports
    included: a cycle through one is still two modules that need each other)."""
    modules = {}
    for layer in PROJECT:
        for path in (repo / layer).rglob("*.py"):
            parts = path.relative_to(repo).with_suffix("").parts
            name = ".".join(parts if parts[0] == "streamrl" else ("streamrl", *parts)).removesuffix(".__init__")
            modules[name] = path
    graph = {}
    for name, path in modules.items():
        found = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                found |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
        graph[name] = {other for other in found if other in modules and other != name}
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for other in sorted(graph[module]):
            if other not in index:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return cycles


def test_no_import_cycle():
    assert import_cycles(module_imports(REPO)) == []


def test_the_cycle_check_sees_a_cycle(tmp_path, monkeypatch):
    (tmp_path / "learner").mkdir()
    (tmp_path / "learner" / "a.py").write_text("from streamrl.learner.b import f\n")
    (tmp_path / "learner" / "b.py").write_text("def f():\n    from streamrl.learner import a\n")
    monkeypatch.setattr(sys.modules[__name__], "PROJECT", ("learner",))
    assert import_cycles(module_imports(tmp_path)) == [["streamrl.learner.a", "streamrl.learner.b"]]
