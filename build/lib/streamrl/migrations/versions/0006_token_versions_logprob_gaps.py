"""per-token weight versions, and the logprob_gaps view

Revision ID: 0006
Revises: 0005

A partial rollout resumed under new weights spans two versions: `token_versions` keeps
the version that sampled each token (int32 per token, null when there is one version)
and `newest_weight_version` the newest of them, beside `weight_version` (the oldest,
which the staleness bound counts). `logprob_gaps` gives each train step's gap between
the learner's logprobs and the behaviour logprobs of the trained tokens, overall and by
how many versions behind the learner the tokens were sampled (lag 0: the same weights,
so any gap is inference/training mismatch).
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

LAGS = ("lag0", "lag1", "lag2plus")
VIEW = (
    "select run_id, step, weight_version, "
    + ", ".join(
        [
            "(metrics->>'logprob_gap_mean')::double precision as gap_mean",
            "(metrics->>'logprob_gap_max')::double precision as gap_max",
        ]
        + [f"(metrics->>'logprob_gap_mean_{lag}')::double precision as gap_mean_{lag}" for lag in LAGS]
        + [f"(metrics->>'logprob_gap_max_{lag}')::double precision as gap_max_{lag}" for lag in LAGS]
        + [f"(metrics->>'tokens_{lag}')::double precision as tokens_{lag}" for lag in LAGS]
    )
    + " from train_steps where metrics ? 'logprob_gap_mean'"
)


def upgrade() -> None:
    op.add_column("trajectories", sa.Column("token_versions", sa.LargeBinary(), nullable=True))
    op.add_column("trajectories", sa.Column("newest_weight_version", sa.Integer(), nullable=True))
    op.add_column("samples", sa.Column("token_versions", sa.LargeBinary(), nullable=True))
    op.execute(f"create or replace view logprob_gaps as {VIEW}")


def downgrade() -> None:
    op.execute("drop view if exists logprob_gaps")
    op.drop_column("samples", "token_versions")
    op.drop_column("trajectories", "newest_weight_version")
    op.drop_column("trajectories", "token_versions")
