"""The run browser's reads, all through the ledger's read-only role (`run_readonly`: a
read-only transaction with a statement timeout, as `streamrl sql`).

Every query is bounded by an index on (run_id, ...) or by a page size, so a ledger with
millions of trajectories answers a page as fast as an empty one: pages are keyset pages
(`id > after`), never OFFSET, and no page counts a whole table.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from streamrl.runtime.sql import SqlFailed, SqlRefused, run_readonly

PAGE = 50  # trajectories per rollout-browser page

RUNS = """
    select r.run_id, coalesce(r.config->>'experiment_name', r.name) as name, r.status, r.parent_run_id,
           r.created_at, r.updated_at,
           (select max(step) from train_steps s where s.run_id = r.run_id) as last_step,
           (select count(*) from runs c where c.parent_run_id = r.run_id) as children,
           (select e.details->>'tag' from run_events e where e.run_id = r.run_id and e.kind = 'created' limit 1) as tag
    from runs r
    where %(tag)s::text is null or exists (select 1 from run_events e where e.run_id = r.run_id
                                           and e.kind = 'created' and e.details->>'tag' = %(tag)s)
    order by r.created_at desc, r.run_id limit %(limit)s offset %(offset)s"""

CURVES = """
    select step, weight_version, loss, kl, entropy, (staleness->>'mean')::float as staleness,
           case when seconds > 0 then tokens / seconds end as tokens_per_s,
           (metrics->>'reward_mean')::float as reward, (metrics->>'logprob_gap_mean')::float as logprob_gap
    from train_steps where run_id = %(run)s order by step"""

VALIDATION = """
    select step as weight_version,
           avg(coalesce((metrics->>'accuracy')::float, reward)) filter (where error is null) as accuracy, count(*)
    from evaluations where run_id = %(run)s and is_val group by step order by step"""

ROLLOUT_COLUMNS = """t.id, t.trajectory_id, t.step, t.group_id, t.sample_index, t.weight_version, t.num_tokens,
    t.finish_reason, t.is_val, e.reward, s.advantage, left(t.response_text, 160) as response"""

ROLLOUT_JOINS = """from trajectories t
    left join lateral (select reward from evaluations e where e.run_id = t.run_id
                       and e.trajectory_id = t.trajectory_id limit 1) e on true
    left join lateral (select advantage from samples s where s.run_id = t.run_id
                       and s.trajectory_id = t.trajectory_id limit 1) s on true"""

TRAJECTORY = """
    select t.trajectory_id, t.task_id, t.group_id, t.step, t.sample_index, t.weight_version, t.is_val, t.prompt_length,
           t.tokens, t.loss_mask, t.logprobs, t.token_versions, t.prompt_text, t.response_text, t.turns,
           t.finish_reason, t.worker_id, t.error, t.timings
    from trajectories t where t.run_id = %(run)s and t.trajectory_id = %(trajectory)s limit 1"""

EVALUATION = """
    select reward, metrics, ground_truth, extra_info, evaluator, error from evaluations
    where run_id = %(run)s and trajectory_id = %(trajectory)s limit 1"""

SAMPLE = """
    select advantage, token_advantages, group_reward_mean, group_reward_std, estimator, step as trained_step
    from samples where run_id = %(run)s and trajectory_id = %(trajectory)s limit 1"""


@dataclass
class Rows:
    columns: list[str]
    rows: list[tuple]

    def dicts(self) -> list[dict[str, Any]]:
        return [dict(zip(self.columns, row)) for row in self.rows]

    def column(self, name: str) -> list:
        index = self.columns.index(name)
        return [row[index] for row in self.rows]


READERS = 4  # requests reading the ledger at once (connections held); others wait, then fail
READER_WAIT_S = 10.0


class SqlBusy(SqlFailed):
    """Every reader slot stayed taken for READER_WAIT_S."""


class Ledger:
    def __init__(self, readonly_url: str):
        self.url = readonly_url
        self.readers = threading.BoundedSemaphore(READERS)

    @contextmanager
    def reader(self):
        """One of READERS slots for the length of a read: the browser never holds more
        of PostgreSQL's connections than that, however many clients call at once."""
        if not self.readers.acquire(timeout=READER_WAIT_S):
            raise SqlBusy(f"the ledger's {READERS} readers stayed busy for {READER_WAIT_S:g} s; try again shortly")
        try:
            yield
        finally:
            self.readers.release()

    def query(self, sql: str, params: dict | None = None) -> Rows:
        with self.reader():
            result = run_readonly(self.url, sql, params)
        return Rows(result.columns, result.rows)

    def runs(self, limit: int = 100, offset: int = 0, tag: str | None = None) -> list[dict]:
        """The newest runs; with `tag`, those started with it (`streamrl run -t TAG`)."""
        return self.query(RUNS, {"limit": limit, "offset": offset, "tag": tag}).dicts()

    def run(self, run_id: str) -> dict | None:
        found = self.query(
            "select run_id, name, status, parent_run_id, config, created_at, updated_at from runs where run_id = %(run)s",
            {"run": run_id},
        ).dicts()
        if not found:
            return None
        run = found[0]
        run["children"] = self.query(
            "select run_id, status from runs where parent_run_id = %(run)s order by created_at", {"run": run_id}
        ).dicts()
        return run

    def curves(self, run_id: str) -> Rows:
        return self.query(CURVES, {"run": run_id})

    def validation(self, run_id: str) -> Rows:
        return self.query(VALIDATION, {"run": run_id})

    def rollouts(
        self,
        run_id: str,
        step: int | None = None,
        group: str | None = None,
        where: str | None = None,
        after: int = 0,
        limit: int = PAGE,
    ) -> list[dict]:
        """One keyset page of a run's trajectories, filtered by step, group or a SQL
        condition over the trajectory `t`, its evaluation `e` and its sample `s`."""
        conditions = ["t.run_id = %(run)s", "t.id > %(after)s"]
        if step is not None:
            conditions.append("t.step = %(step)s")
        if group:
            conditions.append("t.group_id = %(group)s")
        if where:
            # % doubled: the query has parameters, so psycopg reads a lone % as a placeholder
            conditions.append(f"({one_condition(where).replace('%', '%%')})")
        sql = f"select {ROLLOUT_COLUMNS} {ROLLOUT_JOINS} where {' and '.join(conditions)} order by t.id limit %(limit)s"
        return self.query(sql, {"run": run_id, "step": step, "group": group, "after": after, "limit": limit}).dicts()

    def trajectory(self, run_id: str, trajectory_id: str) -> tuple[dict | None, dict | None, dict | None]:
        """(trajectory, its evaluation, its sample), each None when absent."""
        params = {"run": run_id, "trajectory": trajectory_id}
        first = lambda rows: rows[0] if rows else None  # noqa: E731
        return (
            first(self.query(TRAJECTORY, params).dicts()),
            first(self.query(EVALUATION, params).dicts()),
            first(self.query(SAMPLE, params).dicts()),
        )


class FilterRefused(SqlRefused):
    pass


def one_condition(text: str) -> str:
    """`text` if it is one boolean expression that cannot leave the parentheses it is put
    in: its parentheses balance outside string literals and quoted names, and it holds no
    `;`, comment, `$` (dollar quoting) or backslash (escape strings), the places where a
    lexer this small could disagree with PostgreSQL's about where a string ends. Else
    FilterRefused, saying which."""
    depth, index, quote = 0, 0, None
    while index < len(text):
        char, pair = text[index], text[index : index + 2]
        if char == "\\":  # anywhere: in an E'' string it escapes a quote, and the two lexers would part
            raise FilterRefused("the filter may not contain a backslash")
        if quote:
            if char == quote:
                if text[index + 1 : index + 2] == quote:  # a doubled quote stays inside
                    index += 1
                else:
                    quote = None
        elif char in "'\"":
            quote = char
        elif char in ";$" or pair in ("--", "/*"):
            raise FilterRefused(f"the filter may not contain {pair if pair in ('--', '/*') else char!r}")
        elif char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
            if depth < 0:
                raise FilterRefused("the filter closes a parenthesis it did not open")
        index += 1
    if quote or depth:
        raise FilterRefused("the filter leaves a quote or a parenthesis open")
    return text
