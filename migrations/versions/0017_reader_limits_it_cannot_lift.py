"""streamrl_reader: limits it cannot lift, no signals to other sessions, no service metadata

Revision ID: 0017
Revises: 0016

The read-only role serves users' SQL (`streamrl sql`, the run browser's SQL box). Three
gaps remained:

- a query could change its own session's settings with `set_config` (lifting
  `statement_timeout`, raising `work_mem` to gigabytes): `set_config` is revoked from
  PUBLIC in this database, and `temp_file_limit` (a setting only a superuser may change)
  caps the role's temporary files at 1 GB;
- every reader shares the role, so one reader could end or cancel the others' sessions
  (`pg_terminate_backend`, `pg_cancel_backend`): revoked from PUBLIC too;
- the training service's sessions, models and checkpoints (every tenant's metadata and
  checkpoint folders) are not the ledger's to show: the role loses them.

The ledger's own sessions connect as its owner, a superuser, which keeps every function.
Where the migrating user is no superuser the function and setting changes are skipped
with a notice (docs/operations.md); the table grants are revoked either way.
"""

from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None

READER = "streamrl_reader"
FUNCTIONS = ("set_config", "pg_terminate_backend", "pg_cancel_backend")
SERVICE_TABLES = ("service_sessions", "service_models", "service_checkpoints")


def _apply(action: str, grantee: str, temp_file_limit: str, tables: str) -> None:
    names = ", ".join(f"'{name}'" for name in FUNCTIONS)
    op.execute(f"""
    do $$
    declare f regprocedure;
    begin
        if not exists (select 1 from pg_roles where rolname = '{READER}') then
            raise notice 'streamrl: no role {READER}; nothing to change';
            return;
        end if;
        {tables};
        if not (select rolsuper from pg_roles where rolname = current_user) then
            raise notice 'streamrl: % is not a superuser: {READER} can still call set_config and signal '
                         'other sessions, and its temporary files are not capped', current_user;
            return;
        end if;
        for f in select oid::regprocedure from pg_proc where proname in ({names}) loop
            execute format('{action} execute on function %s {grantee}', f);
        end loop;
        for attempt in 1..5 loop  -- the role's settings are the server's: see 0007
            begin
                {temp_file_limit};
                exit;
            exception when internal_error then
                if attempt = 5 then
                    raise;
                end if;
            end;
        end loop;
    end $$;
    """)


def upgrade() -> None:
    _apply(
        "revoke",
        "from public",
        f"alter role {READER} set temp_file_limit = '1GB'",
        f"revoke all on {', '.join(SERVICE_TABLES)} from {READER}",
    )


def downgrade() -> None:
    _apply(
        "grant",
        "to public",
        f"alter role {READER} reset temp_file_limit",
        f"grant select on {', '.join(SERVICE_TABLES)} to {READER}",
    )
