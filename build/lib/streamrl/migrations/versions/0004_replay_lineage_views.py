"""replay lineage columns; analysis views

Revision ID: 0004
Revises: 0003

The views are the ledger's documented query surface (README, "Asking the ledger"):
reward by step and by weight version, group statistics, staleness (trained vs dropped,
by prompt and by length) and lineage both ways.
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

VIEWS = {
    # Training rollouts' reward per step (every rollout, filtered groups included).
    "reward_by_step": """
        select e.run_id, e.step, count(*) as rollouts, avg(e.reward) as reward_mean,
               stddev_pop(e.reward) as reward_std, count(*) filter (where e.error is not null) as evaluator_errors
        from evaluations e where not e.is_val
        group by e.run_id, e.step""",
    # Reward of the rollouts each weight version generated, training and validation apart.
    "reward_by_weight_version": """
        select t.run_id, t.weight_version, t.is_val, count(*) as rollouts, avg(e.reward) as reward_mean,
               avg(t.num_tokens - t.prompt_length) as mean_response_tokens
        from trajectories t
        join evaluations e on e.run_id = t.run_id and e.trajectory_id = t.trajectory_id
        group by t.run_id, t.weight_version, t.is_val""",
    # One row per training group: its rewards and what became of it.
    "group_stats": """
        select e.run_id, e.step, e.group_id, count(*) as received, avg(e.reward) as reward_mean,
               stddev_pop(e.reward) as reward_std, min(e.reward) as reward_min, max(e.reward) as reward_max,
               coalesce(f.reason, case when exists (select 1 from samples s where s.run_id = e.run_id
                                                    and s.group_id = e.group_id) then 'trained' else 'pending' end) as outcome
        from evaluations e
        left join filtered_groups f on f.run_id = e.run_id and f.group_id = e.group_id
        where not e.is_val
        group by e.run_id, e.step, e.group_id, f.reason""",
    # Every sample with its fate: trained in its step, dropped as too stale, or not yet.
    # staleness = the learner's version when it trained the step (step - 1) minus the
    # version that generated the sample.
    "sample_staleness": """
        select s.run_id, s.step, s.trajectory_id, s.group_id, s.weight_version, s.num_tokens,
               (s.step - 1) - s.weight_version as staleness,
               case when s.trajectory_id = any(ts.sample_ids) then 'trained'
                    when s.trajectory_id = any(ts.dropped_ids) then 'dropped'
                    else 'pending' end as status,
               tk.prompt #>> '{}' as prompt
        from samples s
        left join train_steps ts on ts.run_id = s.run_id and ts.step = s.step
        left join trajectories t on t.run_id = s.run_id and t.trajectory_id = s.trajectory_id
        left join tasks tk on tk.run_id = t.run_id and tk.task_id = t.task_id""",
    "staleness_by_prompt": """
        select run_id, prompt, count(*) filter (where status = 'trained') as trained,
               count(*) filter (where status = 'dropped') as dropped, avg(staleness) as mean_staleness
        from sample_staleness group by run_id, prompt""",
    # Lengths in power-of-two buckets: 1, 2, 4, 8, ... tokens (prompt and response).
    "staleness_by_length": """
        select run_id, (2 ^ ceil(log(2, greatest(num_tokens, 1)::numeric)))::int as length_bucket,
               count(*) filter (where status = 'trained') as trained,
               count(*) filter (where status = 'dropped') as dropped, avg(staleness) as mean_staleness
        from sample_staleness group by 1, 2""",
    # Lineage, one row per rollout: task -> trajectory (and the weight version and weight
    # files that generated it) -> sample -> the step that trained it -> the version that
    # step produced. Filter by produced_version to walk back from weights to tasks, or by
    # trajectory_id to walk forward. Replayed runs also name the source event.
    "lineage": """
        select t.run_id, t.task_id, tk.prompt #>> '{}' as prompt, t.trajectory_id, t.group_id,
               t.weight_version as generated_by_version, gv.uri as generated_by_weights,
               t.source_event_id, s.event_id as sample_event_id, s.advantage,
               case when s.trajectory_id = any(ts.sample_ids) then ts.step end as trained_in_step,
               case when s.trajectory_id = any(ts.sample_ids) then ts.weight_version end as produced_version,
               case when s.trajectory_id is null then 'no sample'
                    when s.trajectory_id = any(ts.sample_ids) then 'trained'
                    when s.trajectory_id = any(ts.dropped_ids) then 'dropped'
                    else 'pending' end as status
        from trajectories t
        left join tasks tk on tk.run_id = t.run_id and tk.task_id = t.task_id
        left join weight_versions gv on gv.run_id = t.run_id and gv.version = t.weight_version
        left join samples s on s.run_id = t.run_id and s.trajectory_id = t.trajectory_id
        left join train_steps ts on ts.run_id = s.run_id and ts.step = s.step
        where not t.is_val""",
}


def upgrade() -> None:
    op.add_column("trajectories", sa.Column("source_event_id", sa.Text(), nullable=True))
    op.add_column("evaluations", sa.Column("source_event_id", sa.Text(), nullable=True))
    for name, body in VIEWS.items():
        op.execute(f"create view {name} as {body}")


def downgrade() -> None:
    for name in reversed(list(VIEWS)):
        op.execute(f"drop view if exists {name}")
    op.drop_column("evaluations", "source_event_id")
    op.drop_column("trajectories", "source_event_id")
