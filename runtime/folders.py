"""Folders written whole or not at all: what checkpoints, weight versions and the
training service's saved states are made of."""

from __future__ import annotations

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
