"""an index on trajectories (run_id, id), for pages of one run's rollouts

Revision ID: 0011
Revises: 0010

The run browser pages a run's trajectories in insertion order (`id > after order by id`).
With only the primary key, PostgreSQL walks every run's rows in id order to find one
run's: a page of a small run that shares the ledger with a run of 1M trajectories took
0.5 s (bench/ui_pages.py); with (run_id, id) it reads the page's rows and no others.
"""

from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_trajectories_run_id_id", "trajectories", ["run_id", "id"])


def downgrade() -> None:
    op.drop_index("ix_trajectories_run_id_id", table_name="trajectories")
