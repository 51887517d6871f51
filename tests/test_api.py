"""`streamrl.api`, the names a recipe's own code imports: each resolves to the object
its module defines, and the imports type checkers follow name the same objects."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys

import streamrl.api
from tests.conftest import REPO


def test_every_name_resolves_to_its_modules_object():
    for name, (module, attribute) in streamrl.api._NAMES.items():
        assert getattr(streamrl.api, name) is getattr(importlib.import_module(module), attribute), name
    assert sorted(dir(streamrl.api)) == sorted(streamrl.api._NAMES)


def test_the_type_checking_imports_match_the_lazy_table():
    tree = ast.parse((REPO / "streamrl" / "api.py").read_text())
    (block,) = [n for n in tree.body if isinstance(n, ast.If) and ast.unparse(n.test) == "TYPE_CHECKING"]
    imported = {
        alias.asname or alias.name: (node.module, alias.name)
        for node in block.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    assert imported == streamrl.api._NAMES


def test_a_light_name_does_not_import_torch():
    code = "import sys\nfrom streamrl.api import lookup, is_current\nprint('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert result.stdout.strip() == "False"
