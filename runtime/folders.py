"""Folders written whole or not at all: what checkpoints, weight versions and the
training service's saved states are made of."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path


def write_folder(final: Path, fill) -> Path:
    """Fill a temporary folder (`fill(folder)`), then rename it to `final`: a reader sees
    the whole folder or none of it."""
    tmp = final.parent / f".tmp-{final.name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    fill(tmp)
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    return final


# the file in a run's checkpoint folder naming its newest complete snapshot
# (learner/checkpoint.py writes it)
LATEST_SNAPSHOT = "LATEST"


def run_logs(home: Path, run_id: str) -> Path:
    """Where a run's processes keep logs of their own (servers a backend starts, the
    cluster twin's GPU time)."""
    return home / "runs" / run_id / "logs"


def run_dir(home: Path, run_id: str, configured: str) -> Path:
    """Where a run's checkpoints or weights live: the recipe's path (relative paths are
    under STREAMRL_HOME), one folder per run."""
    base = Path(configured)
    if not base.is_absolute():
        base = home / base
    return base / run_id


def directory_sha256(folder: Path) -> str:
    """The digest of a model folder's weights (its *.safetensors files, by name)."""
    digest = hashlib.sha256()
    for path in sorted(folder.glob("*.safetensors")):
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()
