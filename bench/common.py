"""Shared set-up for the benchmarks: the embedded services under bench/out/home."""

from __future__ import annotations

import os
import sys
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from streamrl.runtime import db, services
from streamrl.runtime.settings import Settings

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


def fresh_database(settings: Settings, name: str) -> Settings:
    """A new, migrated database on the same server, so that a benchmark writes into
    empty tables whatever the ledger already holds."""
    from dataclasses import replace
    from urllib.parse import urlsplit, urlunsplit

    with db.connect(settings.database_url, autocommit=True) as conn:
        conn.execute(f'drop database if exists "{name}"')
        conn.execute(f'create database "{name}"')
    parts = urlsplit(db.psycopg_url(settings.database_url))
    url = urlunsplit(parts._replace(path=f"/{name}"))
    db.upgrade(url)
    return replace(settings, database_url_env=url)


def drop_database(settings: Settings, fresh: Settings) -> None:
    from urllib.parse import urlsplit

    name = urlsplit(fresh.database_url).path.lstrip("/")
    with db.connect(settings.database_url, autocommit=True) as conn:
        conn.execute(f'drop database if exists "{name}" with (force)')
