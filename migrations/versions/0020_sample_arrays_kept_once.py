"""a sample's packed arrays kept once, in its trajectory's row

Revision ID: 0020
Revises: 0019

A sample carries its trajectory's tokens, loss mask, logprobs and per-token versions
(the learner reads them from the samples topic), so the ledger kept every rollout's
arrays twice: the samples table was about half of its bytes. The sink now stores a
sample's arrays as NULL, with `arrays_in_trajectory` true, when they are byte for byte
those of a trajectory row it has written and committed (consumers/sample_arrays.py);
any other sample keeps its own. The `samples_with_arrays` view gives every sample with
its arrays, from wherever they are: what recovery re-publishes and what users' SQL reads.
"""

import sqlalchemy as sa
from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None

ARRAYS = ("tokens", "loss_mask", "logprobs", "token_versions")
OTHER_COLUMNS = (
    "id", "event_id", "run_id", "schema_version", "created_at", "ingested_at", "kafka_topic", "kafka_partition",
    "kafka_offset", "trajectory_id", "group_id", "advantage", "token_advantages", "reward", "group_reward_mean",
    "group_reward_std", "group_size", "estimator", "weight_version", "step", "num_tokens", "arrays_in_trajectory",
)  # fmt: skip

VIEW = f"""
create view samples_with_arrays as
select {", ".join(f"s.{c}" for c in OTHER_COLUMNS)},
       {", ".join(f"case when s.arrays_in_trajectory then t.{c} else s.{c} end as {c}" for c in ARRAYS)}
from samples s
left join lateral (
    select {", ".join(ARRAYS)} from trajectories t
    where s.arrays_in_trajectory and t.run_id = s.run_id and t.trajectory_id = s.trajectory_id
    order by t.id limit 1
) t on true
"""


def upgrade() -> None:
    op.add_column("samples", sa.Column("arrays_in_trajectory", sa.Boolean(), server_default=sa.false(), nullable=False))
    for column in ("tokens", "loss_mask", "logprobs"):
        op.alter_column("samples", column, nullable=True)
    op.execute(VIEW)


def downgrade() -> None:
    op.execute("drop view samples_with_arrays")
    op.execute(f"""
        update samples s set {", ".join(f"{c} = t.{c}" for c in ARRAYS)}
        from trajectories t
        where s.arrays_in_trajectory and t.run_id = s.run_id and t.trajectory_id = s.trajectory_id
    """)
    for column in ("tokens", "loss_mask", "logprobs"):
        op.alter_column("samples", column, nullable=False)
    op.drop_column("samples", "arrays_in_trajectory")
