"""streamrl_reader: the role the read-only commands connect as

Revision ID: 0007
Revises: 0006

`streamrl sql`, `show`, `runs` and `replay --where` run users' SQL. A READ ONLY
transaction stops writes, but a superuser can still read server files
(`pg_read_file`), list directories, stop other sessions or change role. These commands
connect as `streamrl_reader` instead: LOGIN, no superuser, no role or database
creation, SELECT on the ledger's tables and views (now and later ones) and nothing else,
a 30 s statement timeout. It has no password: with trust or peer authentication (the
embedded PostgreSQL, a local one) it just works; on a server with password
authentication give it one and set STREAMRL_READONLY_DATABASE_URL. Where the migrating
user may not create roles the step is skipped with a notice, and the read-only
commands say what to do.
"""

from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

READER = "streamrl_reader"


def upgrade() -> None:
    op.execute(f"""
    do $$
    begin
        -- A role and its settings are the server's, shared by its databases. A ledger
        -- migrating while another on the same server does waits for the other's
        -- transaction, and then fails with "tuple concurrently updated" (internal_error)
        -- or finds the role created (duplicate_object, unique_violation). The other's
        -- change is committed by then: the statements run again and see it.
        for attempt in 1..5 loop
            begin
                if not exists (select 1 from pg_roles where rolname = '{READER}') then
                    create role {READER} login nosuperuser nocreatedb nocreaterole noinherit noreplication;
                end if;
                alter role {READER} set statement_timeout = '30s';
                alter role {READER} set default_transaction_read_only = on;
                exit;
            exception when internal_error or duplicate_object or unique_violation then
                if attempt = 5 then
                    raise;
                end if;
            end;
        end loop;
        execute format('grant connect on database %I to {READER}', current_database());
        grant usage on schema public to {READER};
        grant select on all tables in schema public to {READER};
        alter default privileges in schema public grant select on tables to {READER};
        revoke create on schema public from {READER};
    exception when insufficient_privilege then
        raise notice 'streamrl: could not create the read-only role {READER} (%); the read-only commands '
                     'need STREAMRL_READONLY_DATABASE_URL', sqlerrm;
    end $$;
    """)


def downgrade() -> None:
    op.execute(f"""
    do $$
    begin
        if exists (select 1 from pg_roles where rolname = '{READER}') then
            execute format('revoke all on database %I from {READER}', current_database());
            revoke all on all tables in schema public from {READER};
            alter default privileges in schema public revoke select on tables from {READER};
            revoke usage on schema public from {READER};
        end if;
    end $$;
    """)
