"""train_steps.group_ids: the groups a step accounted for; lineage by them

Revision ID: 0021
Revises: 0020

With `trajectory_pool.batch_groups: first_complete` a step trains the first groups to
complete, whatever step they were published for, so a sample's `step` (the step its task
was published for) no longer names the step that trained it. Each step now records the
groups it accounted for (trained, dropped as stale or filtered); a restarted learner
re-trains a recorded step on exactly those, and `sample_staleness` and `lineage` find the
step that trained a sample by its group. Earlier steps are filled in from their samples
and filtered groups: each trained the groups published for it.
"""

import runpy
from pathlib import Path

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None

# the step that accounted for a sample's group: its own under batch_groups published
TRAINED_BY = """
        left join lateral (
            select ts.step, ts.weight_version, ts.sample_ids, ts.dropped_ids from train_steps ts
            where ts.run_id = s.run_id and ts.group_ids @> array[s.group_id]
            order by ts.step limit 1
        ) ts on true"""

VIEWS = {
    # staleness = the learner's version when it trained the sample (its step - 1), or
    # when pending the one its task was published for, minus the version that generated it
    "sample_staleness": f"""
        select s.run_id, s.step, s.trajectory_id, s.group_id, s.weight_version, s.num_tokens,
               (coalesce(ts.step, s.step) - 1) - s.weight_version as staleness,
               case when s.trajectory_id = any(ts.sample_ids) then 'trained'
                    when s.trajectory_id = any(ts.dropped_ids) then 'dropped'
                    else 'pending' end as status,
               tk.prompt #>> '{{}}' as prompt
        from samples s {TRAINED_BY}
        left join trajectories t on t.run_id = s.run_id and t.trajectory_id = s.trajectory_id
        left join tasks tk on tk.run_id = t.run_id and tk.task_id = t.task_id""",
    "lineage": f"""
        select t.run_id, t.task_id, tk.prompt #>> '{{}}' as prompt, t.trajectory_id, t.group_id,
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
        left join samples s on s.run_id = t.run_id and s.trajectory_id = t.trajectory_id {TRAINED_BY}
        where not t.is_val""",
}


def upgrade() -> None:
    op.add_column("train_steps", sa.Column("group_ids", postgresql.ARRAY(sa.Text()), nullable=True))
    op.execute("""
        update train_steps ts set group_ids = array(
            select group_id from samples s where s.run_id = ts.run_id and s.step = ts.step
            union
            select group_id from filtered_groups f where f.run_id = ts.run_id and f.step = ts.step and f.reason <> 'late'
            order by 1
        )
    """)
    op.create_index("ix_train_steps_group_ids", "train_steps", ["group_ids"], postgresql_using="gin")
    for name, body in VIEWS.items():
        op.execute(f"create or replace view {name} as {body}")


def downgrade() -> None:
    before = runpy.run_path(str(Path(__file__).with_name("0004_replay_lineage_views.py")))["VIEWS"]
    for name in VIEWS:
        op.execute(f"create or replace view {name} as {before[name]}")
    op.drop_index("ix_train_steps_group_ids", "train_steps")
    op.drop_column("train_steps", "group_ids")
