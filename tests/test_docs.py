"""The documentation: generated references are fresh, every relative link resolves,
and the README stays a five-minute read."""

import ast
import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def test_the_cli_reference_is_generated_from_the_cli():
    from streamrl.cli.reference import render

    assert (REPO / "docs" / "cli.md").read_text() == render(), (
        "docs/cli.md is stale: python -m streamrl.cli.reference > docs/cli.md"
    )


def test_every_relative_link_resolves():
    broken = []
    for doc in DOCS:
        for target in LINK.findall(doc.read_text()):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue  # a URL or an anchor in the same page
            path = target.split("#", 1)[0]
            if not (doc.parent / path).exists():
                broken.append(f"{doc.relative_to(REPO)}: {target}")
    assert broken == []


def test_a_broken_link_is_seen(tmp_path):
    doc = tmp_path / "a.md"
    doc.write_text("see [b](b.md) and [site](https://example.org)")
    targets = [t for t in LINK.findall(doc.read_text()) if not re.match(r"[a-z]+:", t)]
    assert targets == ["b.md"] and not (tmp_path / "b.md").exists()


def test_the_readme_is_short():
    assert len((REPO / "README.md").read_text().splitlines()) <= 250


def test_the_recipe_reference_is_generated_from_the_typed_recipe():
    """In a fresh process: tests register throw-away estimators into the registries."""
    import sys

    generated = subprocess.run(
        [sys.executable, "-m", "streamrl.recipe_reference"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout
    assert (REPO / "docs" / "recipe.md").read_text() == generated, (
        "docs/recipe.md is stale: python -m streamrl.recipe_reference > docs/recipe.md"
    )
    assert "| `algorithm.grpo_std_epsilon` | float | `1e-06` | in (0.0, 1.0] |" in generated


def test_the_readme_table_of_verl_keys_is_generated_from_the_mapping_the_recipe_loader_uses():
    from streamrl.recipe_reference import readme_table

    assert readme_table() in (REPO / "README.md").read_text(), (
        "README's verl table is stale: python -m streamrl.recipe_reference --readme"
    )


def test_every_recipe_key_has_a_description():
    from streamrl.recipe_reference import rows
    from streamrl.runtime.config import Recipe

    assert [key for key, _, spec in rows(Recipe) if not spec.metadata.get("help")] == []


# A backticked path whose first part is a folder of the repository (or the installed
# package's name before one) must exist; git-ignored (generated) paths are left out.
TICKED = re.compile(r"`([^`\s]+)`")
PATH_LIKE = re.compile(r"^[\w.-]+(/[\w.-]+)+/?$")
TOP_FOLDERS = {p.name for p in REPO.iterdir() if p.is_dir() and not p.name.startswith(".")}


def repository_path(ticked: str) -> str | None:
    """The repository path a backticked token names, or None when it names none: the
    token less a test id (`::name`), a line or an attribute (`:33`, `:Class`), with the
    installed package's prefix (`streamrl/runtime/...`) mapped to its folder."""
    path = re.split(r"::|:(?=\w)", ticked, maxsplit=1)[0].rstrip("/.,")
    if not PATH_LIKE.match(path):
        return None
    first, _, rest = path.partition("/")
    if first == "streamrl" and rest.split("/")[0] in TOP_FOLDERS - {"streamrl"}:
        path = rest
    return path if path.split("/")[0] in TOP_FOLDERS else None


def docstrings(source: Path) -> list[str]:
    tree = ast.parse(source.read_text())
    nodes = [n for n in ast.walk(tree) if isinstance(n, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)]
    return [text for n in nodes if (text := ast.get_docstring(n, clean=False))]


def git(*args: str, stdin: str | None = None) -> list[str]:
    return subprocess.run(["git", *args], cwd=REPO, input=stdin, capture_output=True, text=True).stdout.split()


def test_every_backticked_repository_path_in_docs_and_docstrings_exists():
    texts = [(str(doc.relative_to(REPO)), doc.read_text()) for doc in DOCS]
    texts += [(name, text) for name in git("ls-files", "*.py") for text in docstrings(REPO / name)]
    named = {(where, path) for where, text in texts for token in TICKED.findall(text) if (path := repository_path(token))}
    missing = {(where, path) for where, path in named if not (REPO / path).exists()}
    ignored = set(git("check-ignore", "--no-index", "--stdin", stdin="\n".join(path for _, path in missing)))
    assert sorted((where, path) for where, path in missing if path not in ignored) == []


def test_a_stale_backticked_path_is_seen():
    assert repository_path("learner/advantage_stage.py") == "learner/advantage_stage.py"
    assert not (REPO / "learner/advantage_stage.py").exists()
    assert repository_path("tests/test_rl_loop.py::test_a_run") == "tests/test_rl_loop.py"
    assert repository_path("learner/loop.py:120") == "learner/loop.py"
    assert repository_path("streamrl/runtime/extras.py") == "runtime/extras.py"
    assert repository_path("my_recipe/recipe.yaml") is None  # not a folder of the repository
