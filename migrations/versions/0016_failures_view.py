"""the `failures` view: every failure of a run, one row each, with where it happened

Revision ID: 0016
Revises: 0015

A run's failures are already in the ledger, spread over four tables: a failed rollout is a
trajectory with an error, an evaluator that raised leaves its error on the evaluation, a
skipped optimizer step is a train step's metric, a sample too stale to train is in its
step's dropped ids, a record nobody could read is a dead letter. This view puts them in
one place, by kind (a rollout error by its exception's name; "rejected" where the worker
refused what the rollout returned), with where each happened (the process, the task,
the data row), so that `streamrl run`, `streamrl show` and a user's SQL count them the
same way (streamrl/failures.py reads it).
"""

from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None

FAILURES = """
    select t.run_id, t.step, t.is_val,
           case when t.error like 'PromptTooLong:%' then 'over-long prompt'
                when t.error is not null then 'rollout error (' ||
                     coalesce(substring(t.error from '^([A-Za-z_][A-Za-z0-9_.]*): '), 'rejected') || ')'
                when e.error is not null then 'evaluator error'
                else 'truncated response' end as kind,
           coalesce(t.error, e.error, 'the response stopped at max_response_length (' ||
                    (t.num_tokens - t.prompt_length) || ' tokens)') as error,
           coalesce(nullif(t.worker_id, ''), 'worker') as process, t.task_id, tk.data as data_row,
           t.created_at, t.id as ledger_id
    from trajectories t
    left join lateral (select ev.error from evaluations ev
                       where ev.run_id = t.run_id and ev.trajectory_id = t.trajectory_id and ev.error is not null
                       order by ev.id limit 1) e on true
    left join tasks tk on tk.run_id = t.run_id and tk.task_id = t.task_id
    where t.error is not null or e.error is not null or t.finish_reason = 'length'
    union all
    select ts.run_id, ts.step, false, 'learner step skipped',
           coalesce((select string_agg(substr(k, length('step_skipped_') + 1), ', ')
                     from jsonb_object_keys(ts.metrics) k where k like 'step\\_skipped\\_%'), 'skipped'),
           'learner', null, null, ts.created_at, ts.id
    from train_steps ts where coalesce((ts.metrics->>'step_skipped')::float, 0) > 0
    union all
    select ts.run_id, ts.step, false, 'dropped stale sample',
           'sample ' || dropped.trajectory_id || ' was past the staleness bound when step ' || ts.step || ' trained',
           'learner', dropped.trajectory_id, null, ts.created_at, ts.id
    from train_steps ts cross join unnest(ts.dropped_ids) as dropped(trajectory_id)
    union all
    select d.run_id, null, false, 'dead letter', d.error, coalesce(nullif(d.stage, ''), 'unknown'), null, null,
           d.created_at, d.id
    from dead_letters d
"""


def upgrade() -> None:
    op.execute(f"create view failures as {FAILURES}")


def downgrade() -> None:
    op.execute("drop view if exists failures")
