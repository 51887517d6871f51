"""train_steps.trained_advantages: a batch-scope estimator's advantages, as trained

Revision ID: 0012
Revises: 0011

REINFORCE++ and REINFORCE++-baseline whiten over a whole step, which only the learner
sees: their samples leave the stream processor with advantage 0 and the learner records
what each sample trained with here, beside `sample_ids`.
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("train_steps", sa.Column("trained_advantages", postgresql.ARRAY(sa.Float()), nullable=True))


def downgrade() -> None:
    op.drop_column("train_steps", "trained_advantages")
