"""Ledgers that share a PostgreSQL server: a role and its settings are the server's, not
a database's, so two ledgers migrating at once change the same catalog rows. Against the
machine's PostgreSQL (STREAMRL_TEST_EXTERNAL_DATABASE_URL, as CI sets it)."""

from __future__ import annotations

import os
import threading
from urllib.parse import urlsplit

import psycopg
import pytest

from streamrl.runtime import db
from streamrl.runtime.settings import READER_ROLE
from tests.conftest import external_ledger, wait_for

EXTERNAL_URL = os.environ.get("STREAMRL_TEST_EXTERNAL_DATABASE_URL")
pytestmark = pytest.mark.skipif(not EXTERNAL_URL, reason="needs an external PostgreSQL (STREAMRL_TEST_EXTERNAL_DATABASE_URL)")


def hold_the_roles_settings(holder: psycopg.Connection) -> None:
    """Update the role's settings row in `holder`'s open transaction, which keeps it locked.
    Another suite on this server may be migrating a ledger too: the same error, the same
    remedy as the migrations'."""
    for attempt in range(5):
        try:
            holder.execute(f"alter role {READER_ROLE} set statement_timeout = '30s'")
            return
        except psycopg.errors.InternalError:
            holder.rollback()
            if attempt == 4:
                raise


@pytest.mark.parametrize("migrated_to", ["0006", "0016"])  # before 0007 and 0017, which set the role's settings
def test_a_ledger_migrates_while_another_on_its_server_holds_the_reader_roles_settings(migrated_to):
    """The second ledger's `alter role streamrl_reader set ...` waits for the first's
    transaction, and on its commit failed with "tuple concurrently updated": two runs
    starting on one server, or two test suites beside each other, could not both migrate."""
    with (
        external_ledger("streamrl_migrates_first") as first,
        external_ledger("streamrl_migrates_second", migrated_to) as second,
    ):
        waiting_database = urlsplit(second).path.lstrip("/")
        failures: list[BaseException] = []

        def migrate() -> None:
            try:
                db.upgrade(second)
            except BaseException as error:  # the test asserts there is none, and shows it
                failures.append(error)

        watcher = db.connect(first, autocommit=True)  # a transaction sees one pg_stat_activity
        with watcher, db.connect(first) as holder:
            hold_the_roles_settings(holder)
            migration = threading.Thread(target=migrate)
            migration.start()
            wait_for(
                lambda: (
                    failures
                    or watcher.execute(
                        "select 1 from pg_stat_activity where datname = %s and wait_event_type = 'Lock'", (waiting_database,)
                    ).fetchone()
                ),
                timeout=120,
                what="the second ledger's migration to wait for the first's transaction",
            )
            holder.commit()
        migration.join(120)
        assert not migration.is_alive()
        assert not failures, failures
        assert db.current_revision(second) == db.current_revision(first)
        with db.connect(second) as conn:
            settings = conn.execute(
                "select s.setconfig from pg_db_role_setting s join pg_roles r on r.oid = s.setrole "
                "where r.rolname = %s and s.setdatabase = 0",
                (READER_ROLE,),
            ).fetchone()[0]
        assert {"statement_timeout=30s", "default_transaction_read_only=on", "temp_file_limit=1GB"} <= set(settings)
