"""A run's failures, read from the ledger's `failures` view (migration 0016): counted by
kind and step, the first of each kind verbatim with where it happened, and the failure
budget (recipe `failure_budget`) past which `streamrl run` stops the run and exits 1.

A failed rollout is one whose rollout or evaluator raised, or whose prompt was too long:
it is recorded (reward 0, the error kept) so that its group completes, and it counts
against the budget. Truncated responses, dropped stale samples, skipped learner steps
and dead letters are counted and shown, not budgeted.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import psycopg

from streamrl.runtime.config import FailureBudget


@dataclass(frozen=True)
class FirstFailure:
    """The first failure of a kind, verbatim, and where it happened."""

    kind: str
    is_val: bool
    error: str
    process: str
    step: int | None
    task_id: str | None
    data_row: str | None

    def where(self) -> str:
        parts = [self.process]
        if self.step is not None:
            parts.append(f"{'validation of version' if self.is_val else 'step'} {self.step}")
        if self.task_id:
            parts.append(f"task {self.task_id}")
        if self.data_row:
            parts.append(f"row {self.data_row[:120]}")
        return ", ".join(parts)


@dataclass
class StepRollouts:
    """One step's (or one validation's) rollouts recorded so far, and how many failed."""

    recorded: int = 0
    failed: int = 0


@dataclass
class Failures:
    """What `load_failures` read: counts by kind ("validation" kinds apart) and the first
    of each kind."""

    counts: dict[str, int] = field(default_factory=dict)
    first: dict[str, FirstFailure] = field(default_factory=dict)


def label(kind: str, is_val: bool) -> str:
    return f"validation {kind}" if is_val else kind


COUNTS = """
select kind, is_val, count(*) from failures where run_id = %(run)s group by kind, is_val
"""
FIRSTS = """
select distinct on (kind, is_val) kind, is_val, error, process, step, task_id, data_row::text
from failures where run_id = %(run)s order by kind, is_val, ledger_id
"""
# One row per (step, is_val): rollouts recorded, and those whose rollout or evaluator failed.
STEP_ROLLOUTS = """
select t.step, t.is_val, count(*),
       count(*) filter (where t.error is not null or exists (
           select 1 from evaluations e where e.run_id = t.run_id and e.trajectory_id = t.trajectory_id
           and e.error is not null))
from trajectories t where t.run_id = %(run)s and t.step >= %(from_step)s group by t.step, t.is_val
"""


def load_failures(conn: psycopg.Connection, run_id: str) -> Failures:
    """Every failure of the run: counts by kind and the first of each."""
    failures = Failures()
    for kind, is_val, count in conn.execute(COUNTS, {"run": run_id}).fetchall():
        failures.counts[label(kind, is_val)] = count
    for kind, is_val, error, process, step, task_id, data_row in conn.execute(FIRSTS, {"run": run_id}).fetchall():
        failures.first[label(kind, is_val)] = FirstFailure(kind, is_val, error, process, step, task_id, data_row)
    return failures


def load_step_rollouts(conn: psycopg.Connection, run_id: str, from_step: int = 0) -> dict[tuple[int, bool], StepRollouts]:
    """Rollouts recorded and failed, by (step, is_val), for steps from `from_step` on (a
    complete step's counts do not change: the caller keeps them)."""
    rows = conn.execute(STEP_ROLLOUTS, {"run": run_id, "from_step": from_step}).fetchall()
    return {(step, is_val): StepRollouts(recorded, failed) for step, is_val, recorded, failed in rows}


KIND_COUNTS = """
select step, is_val, kind, count(*) from failures
where run_id = %(run)s and (step is null or step >= %(from_step)s) group by step, is_val, kind
"""
# the progress line's names for the kinds that are counted, not budgeted
SHORT_NAMES = {
    "truncated response": "truncated",
    "dropped stale sample": "stale dropped",
    "learner step skipped": "steps skipped",
    "dead letter": "dead letters",
}


@dataclass
class StepWatch:
    """The run's rollouts and failures by step, read a window at a time: each poll
    re-reads from the first step not yet complete, so a long run's polls stay small."""

    per_step: int
    per_validation: int
    steps: dict[tuple[int, bool], StepRollouts] = field(default_factory=dict)
    kinds: dict[tuple[int | None, bool, str], int] = field(default_factory=dict)

    def complete(self, key: tuple[int, bool]) -> bool:
        expected = self.per_validation if key[1] else self.per_step
        return self.steps[key].recorded >= expected

    def poll(self, conn: psycopg.Connection, run_id: str, trained_steps: int = 0) -> None:
        """Re-read what may have changed: rollouts of steps not yet complete, and failures
        from there or from the last trained step (a step's skipped update and dropped
        samples are recorded when it trains, after its rollouts)."""
        newest = max((step for step, _ in self.steps), default=0)
        training = {step for step, is_val in self.steps if not is_val}
        not_yet = [step for step in range(1, newest) if step not in training]  # a step whose first rollout is late
        open_steps = [key[0] for key in self.steps if not self.complete(key)]
        from_step = min([newest, *not_yet, *open_steps])
        self.steps.update(load_step_rollouts(conn, run_id, from_step))
        from_step = min(from_step, max(0, trained_steps - 1))
        self.kinds = {key: n for key, n in self.kinds.items() if key[0] is not None and key[0] < from_step}
        for step, is_val, kind, count in conn.execute(KIND_COUNTS, {"run": run_id, "from_step": from_step}).fetchall():
            self.kinds[(step, is_val, kind)] = count

    def breach(self, budget: FailureBudget) -> str | None:
        return budget_breach(self.steps, self.per_step, self.per_validation, budget)

    def note(self) -> str:
        """For the progress line: "failed 12/256 rollouts  truncated 5  dead letters 1"."""
        failed = sum(s.failed for (_, is_val), s in self.steps.items() if not is_val)
        recorded = sum(s.recorded for (_, is_val), s in self.steps.items() if not is_val)
        notes = [f"failed {failed}/{recorded} rollouts"] if failed else []
        others: dict[str, int] = {}
        for (_, is_val, kind), count in self.kinds.items():
            if not is_val and kind in SHORT_NAMES:
                others[SHORT_NAMES[kind]] = others.get(SHORT_NAMES[kind], 0) + count
        notes += [f"{name} {count}" for name, count in others.items()]
        return "  ".join(notes)


def budget_breach(
    steps: dict[tuple[int, bool], StepRollouts], per_step: int, per_validation: int, budget: FailureBudget
) -> str | None:
    """Why the run must stop, or None. `per_step` and `per_validation`: the rollouts a
    training step and a validation make, so that a step is judged before it is complete
    once more than the share has failed."""
    for (step, is_val), rollouts in sorted(steps.items()):
        expected = per_validation if is_val else per_step
        if expected and rollouts.failed > budget.max_failed_share * expected:
            what = f"the validation of version {step}" if is_val else f"step {step}"
            return (
                f"{rollouts.failed} of the {expected} rollouts of {what} failed, more than "
                f"failure_budget.max_failed_share ({budget.max_failed_share:g})"
            )
    if budget.max_steps_over_warn:
        in_a_row: list[int] = []
        for (step, is_val), rollouts in sorted(steps.items()):
            if is_val or not per_step or rollouts.recorded < per_step:
                continue
            in_a_row = [*in_a_row, step] if rollouts.failed > budget.warn_share * per_step else []
            if len(in_a_row) >= budget.max_steps_over_warn:
                return (
                    f"{len(in_a_row)} steps in a row (steps {in_a_row[0]} to {in_a_row[-1]}) had more than "
                    f"failure_budget.warn_share ({budget.warn_share:g}) of their rollouts failed "
                    f"(failure_budget.max_steps_over_warn: {budget.max_steps_over_warn})"
                )
    return None


def first_errors_text(failures: Failures, width: int = 2000) -> list[str]:
    """Each kind's count and its first error, verbatim (up to `width` characters)."""
    lines = []
    for kind, count in sorted(failures.counts.items(), key=lambda kv: -kv[1]):
        first = failures.first.get(kind)
        if first is None:
            continue
        error = first.error if len(first.error) <= width else first.error[:width] + f"... ({len(first.error)} characters)"
        lines.append(f"{kind}: {count}; the first, at {first.where()}:\n  {error}")
    return lines
