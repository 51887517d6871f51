"""Alembic environment: the ledger's tables are `schema.ledger.metadata`, the training
service's `schema.service.service_metadata`. A run's own rollout tables (migration 0019)
are its partitions, not models: comparisons skip them."""

import re

from alembic import context
from sqlalchemy import engine_from_config, pool

from streamrl.schema.ledger import ROLLOUT_TABLE_NAMES
from streamrl.schema.ledger import metadata as ledger_metadata
from streamrl.schema.service import service_metadata

metadata = [ledger_metadata, service_metadata]

config = context.config
RUN_PARTITION = re.compile(rf"({'|'.join(ROLLOUT_TABLE_NAMES)})_r_[0-9a-f]{{16}}")


def include_name(name, type_, parent_names) -> bool:
    return not (type_ == "table" and RUN_PARTITION.fullmatch(name or ""))


def run_migrations_offline() -> None:
    context.configure(
        url=config.get_main_option("sqlalchemy.url"), target_metadata=metadata, literal_binds=True, include_name=include_name
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connectable = engine_from_config(
        config.get_section(config.config_ini_section, {}), prefix="sqlalchemy.", poolclass=pool.NullPool
    )
    with connectable.connect() as connection, connection.begin():
        # Two processes running `db upgrade` at once must not both create the tables.
        connection.exec_driver_sql("select pg_advisory_xact_lock(7426101)")
        context.configure(connection=connection, target_metadata=metadata, include_name=include_name)
        context.run_migrations()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
