"""Shared set-up for the benchmarks: the embedded services under bench/out/home."""

from __future__ import annotations

import os
import sys
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from streamrl import db, services  # noqa: E402
from streamrl.settings import Settings  # noqa: E402

OUT = Path(__file__).resolve().parent / "out"


def bench_settings() -> Settings:
    """External services when STREAMRL_* say so, else embedded ones under bench/out/home."""
    os.environ.setdefault("STREAMRL_HOME", str(OUT / "home"))
    settings = Settings.from_env()
    services.up(settings)
    db.upgrade(settings.database_url)
    return settings


def fresh_run_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"
