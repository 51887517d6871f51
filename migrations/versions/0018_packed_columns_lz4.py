"""the packed token columns compressed with lz4 where the server has it

Revision ID: 0018
Revises: 0017

Trajectories and samples carry every token's id, mask, logprob and weight version as
packed arrays: nearly all of the ledger's bytes. PostgreSQL compresses such values with
pglz unless a column says otherwise; lz4 stored them smaller and the sink wrote them
faster (`python bench/ledger_bytes.py`, docs/benchmarks.md). A server built without lz4
(the embedded one) keeps pglz, with a notice. Only values written from now on change.
"""

from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None

PACKED = {
    "trajectories": ("tokens", "loss_mask", "logprobs", "token_versions"),
    "samples": ("tokens", "loss_mask", "logprobs", "token_versions", "token_advantages"),
}


def _set(method: str) -> None:
    statements = "\n".join(
        f"alter table {table} alter column {column} set compression {method};"
        for table, columns in PACKED.items()
        for column in columns
    )
    op.execute(f"""
    do $$
    begin
        if not exists (select 1 from pg_settings where name = 'default_toast_compression'
                       and '{method}' = any(enumvals)) then
            raise notice 'streamrl: this PostgreSQL has no {method} compression; the packed columns keep pglz';
            return;
        end if;
        {statements}
    end $$;
    """)


def upgrade() -> None:
    _set("lz4")


def downgrade() -> None:
    _set("pglz")
