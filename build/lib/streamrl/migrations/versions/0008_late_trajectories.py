"""group_stats leaves out `late` filtered-group records

Revision ID: 0008
Revises: 0007

The processor now records trajectories that reach a group after it closed (it timed
out first) as GroupFiltered rows with reason `late`, one per arrival, so that the ledger
accounts for every trajectory. A group can then have two filtered_groups rows; the
group_stats view keeps one row per group by joining only the group's own outcome.
"""

from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def group_stats(join_condition: str) -> str:
    return f"""
        create or replace view group_stats as
        select e.run_id, e.step, e.group_id, count(*) as received, avg(e.reward) as reward_mean,
               stddev_pop(e.reward) as reward_std, min(e.reward) as reward_min, max(e.reward) as reward_max,
               coalesce(f.reason, case when exists (select 1 from samples s where s.run_id = e.run_id
                                                    and s.group_id = e.group_id) then 'trained' else 'pending' end) as outcome
        from evaluations e
        left join filtered_groups f on f.run_id = e.run_id and f.group_id = e.group_id{join_condition}
        where not e.is_val
        group by e.run_id, e.step, e.group_id, f.reason"""


def upgrade() -> None:
    op.execute(group_stats(" and f.reason <> 'late'"))


def downgrade() -> None:
    op.execute(group_stats(""))
