"""Connections to the ledger: psycopg for the hot paths, SQLAlchemy for migrations/queries.

SQLAlchemy and Alembic are imported where they are used: every process of a run
connects through this module, and only the orchestrator migrates. Imported here, they
were about a quarter of a light process's start-up CPU (a sink, a processor), all of
them starting at once on the run's cores.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import psycopg

if TYPE_CHECKING:
    import sqlalchemy
    from alembic.config import Config

MIGRATIONS_DIR = Path(__file__).resolve().parent.parent / "migrations"


def psycopg_url(url: str) -> str:
    """psycopg wants plain postgresql://; accept SQLAlchemy's driver-qualified form too."""
    for prefix in ("postgresql+psycopg://", "postgresql+psycopg2://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql://" + url[len(prefix) :]
    return url


def sqlalchemy_url(url: str) -> str:
    return "postgresql+psycopg://" + psycopg_url(url)[len("postgresql://") :]


def connect(url: str, **kwargs) -> psycopg.Connection:
    return psycopg.connect(psycopg_url(url), **kwargs)


def engine(url: str) -> sqlalchemy.Engine:
    import sqlalchemy

    return sqlalchemy.create_engine(sqlalchemy_url(url), pool_pre_ping=True)


def alembic_config(url: str) -> Config:
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    # '%' must be doubled in ini-style config values.
    config.set_main_option("sqlalchemy.url", sqlalchemy_url(url).replace("%", "%%"))
    return config


def upgrade(url: str, revision: str = "head") -> None:
    from alembic import command

    command.upgrade(alembic_config(url), revision)


def current_revision(url: str) -> str | None:
    with connect(url) as conn:
        try:
            row = conn.execute("select version_num from alembic_version").fetchone()
        except psycopg.errors.UndefinedTable:
            return None
    return row[0] if row else None
