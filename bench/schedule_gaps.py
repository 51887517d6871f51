"""Where a fully-async twin run's schedule loses time, read from its ledger and logs.

Two questions, over a window of the run:
- When the learner waited between steps, what did it wait for? The group that arrived
  last among those a step trained holds the step back. If it was published for step
  s - k or earlier (k: weight.staleness_threshold), the step waited for an overdue
  group (first complete groups wait for those); otherwise for other groups (a step's
  own, with the groups published for it).
- Were the GPUs short of tasks? Rollouts published and not yet finished, against the
  GPUs' room (inference GPUs x max_running): time under it is time the engines could
  not fill their batches, whatever the worker did.

Used by bench/cluster_twin.py; `python bench/schedule_gaps.py RUN_ID K SLOTS` reads a
kept run (STREAMRL_DATABASE_URL, STREAMRL_HOME as the bench ran it).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np

Query = Callable[..., list[tuple]]
TIMES = "select extract(epoch from created_at) from {table} where run_id = %s and not is_val"


def learner_steps(logs: Path) -> list[tuple[float, float]]:
    """(start, seconds) of each modelled training step, step 1 first."""
    lines = (logs / "learner-twin.jsonl").read_text().splitlines()
    return [(float(d["time"]), float(d["seconds"])) for d in map(json.loads, lines)]


def schedule_gaps(query: Query, logs: Path, run_id: str, t0: float, t1: float, k: int, slots: int) -> dict:
    published = {
        group: (int(step), float(at))
        for group, step, at in query(
            "select group_id, min(step), extract(epoch from min(created_at)) from tasks "
            "where run_id = %s and not is_val group by group_id",
            run_id,
        )
    }
    finished = {
        group: float(at)
        for group, at in query(
            "select group_id, extract(epoch from max(created_at)) from trajectories "
            "where run_id = %s and not is_val group by group_id",
            run_id,
        )
    }
    trained = {
        int(step): list(groups or [])
        for step, groups in query("select step, group_ids from train_steps where run_id = %s", run_id)
    }
    idle = {"overdue group": 0.0, "other groups": 0.0}
    previous_end = None
    for step, (start, seconds) in enumerate(learner_steps(logs), start=1):
        groups = [g for g in trained.get(step, []) if g in finished and g in published]
        if previous_end is not None and t0 <= start <= t1 and groups:
            last = max(groups, key=finished.__getitem__)
            overdue = k > 0 and published[last][0] <= step - k  # sync (k = 0) trains its own step's groups
            idle["overdue group" if overdue else "other groups"] += max(0.0, start - previous_end)
        previous_end = start + seconds
    releases, ends = (np.sort([float(at) for (at,) in query(TIMES.format(table=t), run_id)]) for t in ("tasks", "trajectories"))
    grid = np.arange(t0, t1, 0.05)
    unfinished = np.searchsorted(releases, grid, side="right") - np.searchsorted(ends, grid, side="right")
    window = max(t1 - t0, 1e-9)
    return {
        "learner_idle_s": {why: round(s, 2) for why, s in idle.items()},
        "learner_idle_share": {why: s / window for why, s in idle.items()},
        "unfinished_rollouts_p10_p50_p90": [float(np.percentile(unfinished, q)) for q in (10, 50, 90)] if len(grid) else [],
        "short_of_tasks": float(np.mean(unfinished < slots)) if len(grid) else float("nan"),
    }


if __name__ == "__main__":
    from common import bench_settings

    from streamrl.runtime.db import connect
    from streamrl.runtime.folders import run_logs

    run, k, slots = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    settings = bench_settings()
    with connect(settings.database_url, autocommit=True) as conn:

        def ask(sql: str, *params) -> list[tuple]:
            return conn.execute(sql, params).fetchall()

        steps = ask("select extract(epoch from created_at) from train_steps where run_id = %s order by step", run)
        times = [float(at) for (at,) in steps]
        print(json.dumps(schedule_gaps(ask, run_logs(settings.home, run), run, times[0], times[-2], k, slots), indent=1))
