"""worker_metrics: the rollouts' metrics per run, step and name

Revision ID: 0009
Revises: 0008

Evaluators' metrics and what workers log with `experiment_logger_post` are kept on each
rollout's evaluation (JSONB); this view is their per-step mean and count, the shape a
tracker plots (`select * from worker_metrics where run_id = ... and name = ...`).
"""

from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("""
        create or replace view worker_metrics as
        select e.run_id, e.step, m.key as name, avg(m.value::float8) as mean, count(*) as rollouts
        from evaluations e, jsonb_each_text(coalesce(e.metrics, '{}'::jsonb)) m
        where not e.is_val and m.value ~ '^-?[0-9.eE+-]+$'
        group by e.run_id, e.step, m.key""")


def downgrade() -> None:
    op.execute("drop view if exists worker_metrics")
