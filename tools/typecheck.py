"""mypy over the installed layout: the layer folders are subpackages of `streamrl` only
once installed (setuptools' package-dir), and mypy reads no import hooks. So this builds
build/typecheck/streamrl/ from links to the real folders and files, runs mypy on it (the
settings are pyproject.toml's [tool.mypy]), and prints the errors with the real paths.

    python tools/typecheck.py            # what `make lint` runs
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TREE = REPO / "build" / "typecheck"


def package_dirs() -> dict[str, str]:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    return config["tool"]["setuptools"]["package-dir"]


def build_tree() -> dict[str, str]:
    """Links TREE/streamrl/<layer> -> <layer>/ (and streamrl's own entries); returns the
    tree's path prefixes -> the real ones, to print errors where a developer edits."""
    shutil.rmtree(TREE, ignore_errors=True)
    package = TREE / "streamrl"
    package.mkdir(parents=True)
    for entry in (REPO / "streamrl").iterdir():
        if entry.name != "__pycache__":
            (package / entry.name).symlink_to(entry)
    prefixes = {}
    for name, folder in package_dirs().items():
        if name == "streamrl" or name == "streamrl.contrib":
            continue
        link = package / name.removeprefix("streamrl.")
        link.symlink_to(REPO / folder)
        prefixes[f"{link.relative_to(REPO)}/"] = f"{folder}/"
    prefixes[f"{package.relative_to(REPO)}/"] = "streamrl/"
    return prefixes


def cache_dir() -> Path:
    """mypy's cache, kept outside the checkout like the SGLang environment: most of a cold
    run is reading torch's and transformers' annotations, and mypy reuses an entry whose
    file has the same content at another path (a fresh clone, its own .venv)."""
    import mypy.version

    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "streamrl" / f"mypy-{mypy.version.__version__}-py{sys.version_info.major}.{sys.version_info.minor}"


def main() -> int:
    prefixes = build_tree()
    command = [sys.executable, "-m", "mypy", "--cache-dir", str(cache_dir()), *sys.argv[1:]]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    for line in (result.stdout + result.stderr).splitlines():
        for tree_prefix, real_prefix in prefixes.items():
            if line.startswith(tree_prefix):
                line = real_prefix + line.removeprefix(tree_prefix)
                break
        print(line)
    return result.returncode


if __name__ == "__main__":
    sys.exit(main())
