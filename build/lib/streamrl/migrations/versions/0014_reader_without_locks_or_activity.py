"""streamrl_reader can neither take advisory locks nor read other sessions' queries

Revision ID: 0014
Revises: 0013

The read-only role serves users' SQL. With PostgreSQL's defaults any role may call the
advisory-lock functions (a reader holding the migrations' lock makes `streamrl db
upgrade` wait) and read `pg_stat_activity` (every reader session shares the role, so each
sees the others' query texts). Both are granted to PUBLIC, so they are revoked from
PUBLIC in this database: the ledger's own sessions connect as its owner, a superuser
(the embedded server's, or the one that ran this migration), which keeps them. Where the
migrating user is no superuser nothing changes, with a notice (docs/operations.md).
"""

from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def _apply(action: str, grantee_clause: str) -> None:
    op.execute(f"""
    do $$
    declare f regprocedure;
    begin
        if not exists (select 1 from pg_roles where rolname = 'streamrl_reader') then
            raise notice 'streamrl: no role streamrl_reader; nothing to change';
            return;
        end if;
        if not (select rolsuper from pg_roles where rolname = current_user) then
            raise notice 'streamrl: % is not a superuser: streamrl_reader can still take advisory locks and read '
                         'pg_stat_activity', current_user;
            return;
        end if;
        for f in select oid::regprocedure from pg_proc
                 where proname like 'pg%advisory%' or proname in ('pg_stat_get_activity', 'pg_stat_get_backend_activity')
        loop
            execute format('{action} execute on function %s {grantee_clause}', f);
        end loop;
        execute '{action} select on pg_catalog.pg_stat_activity {grantee_clause}';
    end $$;
    """)


def upgrade() -> None:
    _apply("revoke", "from public")


def downgrade() -> None:
    _apply("grant", "to public")
