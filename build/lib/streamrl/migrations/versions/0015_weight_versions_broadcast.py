"""weight_versions.broadcast: how a version was sent to the servers (weight.transport distributed)

Revision ID: 0015
Revises: 0014

A broadcast version is announced before its folder is written, with the rendezvous, the
group and the tensors' names, dtypes and shapes; the ledger keeps that beside `uri`
(null for a version the servers load from its folder).
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("weight_versions", sa.Column("broadcast", postgresql.JSONB(), nullable=True))


def downgrade() -> None:
    op.drop_column("weight_versions", "broadcast")
