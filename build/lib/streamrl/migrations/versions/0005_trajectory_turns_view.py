"""trajectory_turns view: multi-turn rollouts turn by turn

Revision ID: 0005
Revises: 0004

A multi-turn trajectory keeps its segments in `trajectories.turns` (JSONB); this view
gives one row per segment: its role, token span, whether it trained, its per-turn reward,
and what the agent loop noted (finish reason, tools called, weight version).
"""

from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

VIEW = """
    select t.run_id, t.trajectory_id, t.step, t.is_val, t.weight_version,
           (turn.ordinality - 1)::int as turn_index,
           turn.value->>'role' as role,
           (turn.value->>'start')::int as start_token,
           (turn.value->>'end')::int as end_token,
           (turn.value->>'end')::int - (turn.value->>'start')::int as num_tokens,
           coalesce((turn.value->>'trained')::boolean, false) as trained,
           (turn.value->>'reward')::double precision as reward,
           coalesce(turn.value->'meta', '{}'::jsonb) as meta
    from trajectories t
    cross join lateral jsonb_array_elements(coalesce(t.turns, '[]'::jsonb)) with ordinality as turn(value, ordinality)
"""


def upgrade() -> None:
    op.execute(f"create or replace view trajectory_turns as {VIEW}")


def downgrade() -> None:
    op.execute("drop view if exists trajectory_turns")
