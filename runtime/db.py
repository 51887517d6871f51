"""Connections to the ledger: psycopg for the hot paths, SQLAlchemy for migrations/queries."""

from __future__ import annotations

from pathlib import Path

import psycopg
import sqlalchemy
from alembic import command
from alembic.config import Config

MIGRATIONS_DIR = Path(__file__).resolve().parent.parent / "migrations"


def psycopg_url(url: str) -> str:
    """psycopg wants plain postgresql://; accept SQLAlchemy's driver-qualified form too."""
    for prefix in ("postgresql+psycopg://", "postgresql+psycopg2://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql://" + url[len(prefix):]
    return url


def sqlalchemy_url(url: str) -> str:
    return "postgresql+psycopg://" + psycopg_url(url)[len("postgresql://"):]


def connect(url: str, **kwargs) -> psycopg.Connection:
    return psycopg.connect(psycopg_url(url), **kwargs)


def engine(url: str) -> sqlalchemy.Engine:
    return sqlalchemy.create_engine(sqlalchemy_url(url), pool_pre_ping=True)


def alembic_config(url: str) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    # '%' must be doubled in ini-style config values.
    config.set_main_option("sqlalchemy.url", sqlalchemy_url(url).replace("%", "%%"))
    return config


def upgrade(url: str, revision: str = "head") -> None:
    command.upgrade(alembic_config(url), revision)


def current_revision(url: str) -> str | None:
    with connect(url) as conn:
        try:
            row = conn.execute("select version_num from alembic_version").fetchone()
        except psycopg.errors.UndefinedTable:
            return None
    return row[0] if row else None
