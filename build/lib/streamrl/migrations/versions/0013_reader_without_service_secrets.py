"""streamrl_reader loses the training service's keys and request payloads

Revision ID: 0013
Revises: 0012

The read-only role serves users' SQL (`streamrl sql`, the run browser's SQL box and
rollout filter). Training-service API keys (their digests) and request payloads (every
tenant's data) are not the ledger's to show: the role may not read those two tables.
Skipped with a notice where the role does not exist.
"""

from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

READER = "streamrl_reader"
PRIVATE = ("service_api_keys", "service_requests")


def upgrade() -> None:
    op.execute(f"""
    do $$
    begin
        if exists (select 1 from pg_roles where rolname = '{READER}') then
            revoke all on {", ".join(PRIVATE)} from {READER};
        else
            raise notice 'streamrl: no role {READER}; nothing to revoke';
        end if;
    end $$;
    """)


def downgrade() -> None:
    op.execute(f"""
    do $$
    begin
        if exists (select 1 from pg_roles where rolname = '{READER}') then
            grant select on {", ".join(PRIVATE)} to {READER};
        end if;
    end $$;
    """)
