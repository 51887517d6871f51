"""The guide's listings in tests/seed_examples/listings/ are its text: every Python block
of the guide is either there, unchanged apart from import lines, and run by the test the
catalogue names, or listed as not runnable with the reason (tests/seed_examples/catalogue.py)."""

from __future__ import annotations

import ast
import re
import textwrap
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.seed_examples.catalogue import NOT_RUN, RUN

SEEDS = REPO.parent / "shared" / "seeds"
# the guide's text lives beside the checkout, not in it: a clone on its own skips these
needs_the_guide = pytest.mark.skipif(not SEEDS.is_dir(), reason=f"the guide's text is not at {SEEDS}")
LISTINGS = REPO / "tests" / "seed_examples" / "listings"
SEED_TESTS = REPO / "tests" / "test_seed_examples.py"


def guide_blocks() -> dict[str, str]:
    """Every ```python block of the guide, as `FFF_NN` (the file's prefix, the block's number)."""
    blocks = {}
    for path in sorted(SEEDS.glob("[0-9][0-9][0-9]_*.txt")):
        found = re.findall(r"^([ \t]*)```python[ \t]*\n(.*?)^[ \t]*```[ \t]*$", path.read_text(), re.S | re.M)
        for number, (_, body) in enumerate(found, 1):
            blocks[f"{path.name[:3]}_{number:02d}"] = textwrap.dedent(body)
    return blocks


def without_imports(source: str) -> list[str]:
    """The lines that are not import statements (a parenthesised import spans lines), without
    trailing spaces, blank lines at either end dropped."""
    kept, in_import = [], False
    for line in source.splitlines():
        stripped = line.strip()
        if in_import:
            in_import = ")" not in stripped
            continue
        if re.match(r"(import \w|from [\w.]+ import )", stripped):
            in_import = stripped.endswith("(")
            continue
        kept.append(line.rstrip())
    while kept and not kept[0]:
        kept.pop(0)
    while kept and not kept[-1]:
        kept.pop()
    return kept


def listing_body(path: Path) -> str:
    """A listing file less its module docstring (ours, saying which block it is)."""
    source = path.read_text()
    docstring = ast.get_docstring(ast.parse(source), clean=False)
    return source.split('"""', 2)[2] if docstring is not None else source


@needs_the_guide
def test_every_guide_block_is_catalogued_once():
    blocks = guide_blocks()
    assert len(blocks) == 60
    assert not set(RUN) & set(NOT_RUN)
    assert set(RUN) | set(NOT_RUN) == set(blocks)


@needs_the_guide
def test_each_listing_is_the_guides_text_apart_from_imports():
    blocks = guide_blocks()
    files = {path.stem[1:]: path for path in LISTINGS.glob("s[0-9][0-9][0-9]_[0-9][0-9].py")}
    assert set(files) == set(RUN)
    for block, path in files.items():
        assert without_imports(listing_body(path)) == without_imports(blocks[block]), f"{path.name} differs from the guide"


def test_each_listing_is_run_by_the_test_the_catalogue_names():
    """The named test uses the listing's module: in its own body, or in a class or function
    of the test module it names (a host class for a listing's methods)."""
    source = SEED_TESTS.read_text()
    tree = ast.parse(source)
    defined = {
        node.name: ast.get_source_segment(source, node) for node in tree.body if isinstance(node, (ast.FunctionDef, ast.ClassDef))
    }
    for block, test in RUN.items():
        assert test in defined, f"{block}: {test} is not in {SEED_TESTS.name}"
        used = [defined[test]] + [text for name, text in defined.items() if re.search(rf"\b{name}\b", defined[test])]
        assert any(re.search(rf"\bs{block}\b", text) for text in used), f"{block}: {test} does not use listings/s{block}.py"


def test_without_imports_drops_only_imports():
    source = "from a import (\n    b,\n    c\n)\nimport re\nx = 1\n    from ..m import n\ny = 'import z'\n"
    assert without_imports(source) == ["x = 1", "y = 'import z'"]
