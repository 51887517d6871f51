"""A run's story from the ledger: reward by step, validation accuracy by weight version,
throughput and staleness; as a table and as a reward-curve PNG."""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from streamrl.runtime.db import connect
from streamrl.runtime.sql import plain_value, visible


@dataclass
class RunSummary:
    run_id: str
    steps: list[int] = field(default_factory=list)
    reward_by_step: list[float] = field(default_factory=list)
    val_versions: list[int] = field(default_factory=list)
    # over the rollouts scored (no error in the rollout or its evaluator); None: none was
    val_accuracy: list[float | None] = field(default_factory=list)
    val_counts: list[int] = field(default_factory=list)  # rollouts recorded, scored or not
    val_errored: list[int] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)
    totals: dict[str, float] = field(default_factory=dict)
    warmup: dict = field(default_factory=dict)  # the learner's `started` details
    finish: dict | None = None  # the learner's `finished` details, once it has finished


COUNT_QUERY = """
select 'tasks', count(*) from tasks where run_id = %(run)s and not is_val
union all select 'validation tasks', count(*) from tasks where run_id = %(run)s and is_val
union all select 'trajectories', count(*) from trajectories where run_id = %(run)s and not is_val
union all select 'evaluations', count(*) from evaluations where run_id = %(run)s and not is_val
union all select 'samples', count(*) from samples where run_id = %(run)s
union all select 'filtered groups', count(*) from filtered_groups where run_id = %(run)s
union all select 'train steps', count(*) from train_steps where run_id = %(run)s
union all select 'weight versions', count(*) from weight_versions where run_id = %(run)s
union all select 'dead letters', count(*) from dead_letters where run_id = %(run)s
"""


COUNT_NAMES = [line.split("'")[1] for line in COUNT_QUERY.strip().splitlines()]


# the summary's rows over the learner's per-step metrics (learner/batch_summary.py): label,
# aggregate over the steps, metric
STEP_METRIC_TOTALS = (
    ("response length, mean", "avg", "response_length/mean"),
    ("response length, max", "max", "response_length/max"),
    ("responses at the length limit (share)", "avg", "response_length/clip_ratio"),
    ("reward std within a step, mean", "avg", "critic/score/std"),
    ("zero-std groups (share)", "avg", "groups/zero_std_share"),
    ("rollout tokens/s, mean", "avg", "perf/rollout_tokens_per_s"),
    ("learner tokens/s, mean", "avg", "perf/learner_tokens_per_s"),
    ("time waiting for samples (s)", "sum", "timing_s/wait"),
    ("time updating the policy (s)", "sum", "timing_s/update_actor"),
)


def load_summary(database_url: str, run_id: str, with_counts: bool = True) -> RunSummary:
    summary = RunSummary(run_id)
    with connect(database_url, autocommit=True) as conn:
        rows = conn.execute(
            "select step, (metrics->>'reward_mean')::float from train_steps where run_id = %s order by step", (run_id,)
        ).fetchall()
        summary.steps = [r[0] for r in rows]
        summary.reward_by_step = [r[1] or 0.0 for r in rows]
        rows = conn.execute(
            # an evaluator's `accuracy` metric where it reports one (shaped rewards), else the
            # reward; over scored rollouts only: an error is not a wrong answer
            "select step, avg(coalesce((metrics->>'accuracy')::float, reward)) filter (where error is null), count(*), "
            "count(*) filter (where error is not null) from evaluations "
            "where run_id = %s and is_val "
            "group by step order by step",
            (run_id,),
        ).fetchall()
        summary.val_versions = [r[0] for r in rows]
        summary.val_accuracy = [None if r[1] is None else float(r[1]) for r in rows]
        summary.val_counts = [r[2] for r in rows]
        summary.val_errored = [r[3] for r in rows]
        row = conn.execute(
            "select details from run_events where run_id = %s and kind = 'started' and name = 'learner'", (run_id,)
        ).fetchone()
        summary.warmup = (row[0] or {}) if row else {}
        row = conn.execute(
            "select details from run_events where run_id = %s and kind = 'finished' and name = 'learner'", (run_id,)
        ).fetchone()
        summary.finish = (row[0] or {}) if row else None
        if with_counts:
            counts: dict[str, int] = dict(conn.execute(COUNT_QUERY, {"run": run_id}).fetchall())
            summary.counts = {name: counts[name] for name in COUNT_NAMES}  # a union's rows come in any order
            row = conn.execute(
                "select sum(seconds), sum(tokens), sum(samples), avg((staleness->>'mean')::float), "
                "max((staleness->>'max')::float), sum((staleness->>'dropped')::float), "
                "extract(epoch from max(created_at) - min(created_at)), "
                + ", ".join(f"{how}((metrics->>'{name}')::float)" for _, how, name in STEP_METRIC_TOTALS)
                + " from train_steps where run_id = %s",
                (run_id,),
            ).fetchone()
            keys = (
                "learner seconds",
                "trained tokens",
                "trained samples",
                "mean staleness",
                "max staleness",
                "dropped stale samples",
                "first to last step (s)",
                *(label for label, _, _ in STEP_METRIC_TOTALS),
            )
            summary.totals = {k: float(v) for k, v in zip(keys, row or ()) if v is not None}
    return summary


def val_complete(summary: RunSummary, version: int, expected: int) -> bool:
    """Every held-out rollout of `version` is recorded (scored or failed)."""
    return dict(zip(summary.val_versions, summary.val_counts)).get(version, 0) >= expected


def val_text(summary: RunSummary, index: int) -> str:
    """One validation's accuracy for people: "0.850", or "n/a: 16 of 16 errored"."""
    accuracy, count, errored = summary.val_accuracy[index], summary.val_counts[index], summary.val_errored[index]
    if accuracy is None:
        return f"n/a: {errored} of {count} errored"
    return f"{accuracy:.3f}" + (f" ({errored} of {count} errored)" if errored else "")


def smooth(values: list[float], window: int) -> list[float]:
    out, total = [], 0.0
    for i, value in enumerate(values):
        total += value
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def plot_reward_curve(summary: RunSummary, path: Path) -> Path:
    import matplotlib  # matplotlib is slow to import; only reports need it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    if summary.steps:
        ax.plot(summary.steps, summary.reward_by_step, color="tab:blue", alpha=0.25, label="train reward (per step)")
        ax.plot(summary.steps, smooth(summary.reward_by_step, 10), color="tab:blue", label="train reward (10-step mean)")
    if summary.val_versions:
        scored = [(v, a) for v, a in zip(summary.val_versions, summary.val_accuracy) if a is not None]
        if scored:
            ax.plot(*zip(*scored), "o-", color="tab:orange", label="held-out validation accuracy")
    ax.set_ylim(-0.02, 1.02)
    return save_plot(fig, ax, path, f"run {summary.run_id}", "step (weight version)", "reward / accuracy", "lower right")


def save_plot(fig, ax, path: Path, title: str, xlabel: str, ylabel: str, legend: str = "best") -> Path:
    """Labels, grid and legend, written as a PNG at `path`."""
    import matplotlib.pyplot as plt

    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(loc=legend)
    ax.set_title(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_logprob_gap(database_url: str, run_id: str, path: Path) -> Path | None:
    """|learner - behaviour| logprob per step (mean and max; lag 0 = tokens sampled by the
    weights being trained, where a gap is inference/training mismatch), log scale; None
    when the run recorded no gap."""
    with connect(database_url, autocommit=True) as conn:
        rows = conn.execute(
            "select step, gap_mean, gap_max, gap_mean_lag0, gap_mean_lag1 from logprob_gaps where run_id = %s order by step",
            (run_id,),
        ).fetchall()
    if not rows:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    steps = [r[0] for r in rows]
    for column, label, style in (
        (1, "mean, all trained tokens", "-"),
        (2, "max, all trained tokens", ":"),
        (3, "mean, lag 0 (same weights)", "-"),
        (4, "mean, lag 1", "--"),
    ):
        points = [(s, r[column]) for s, r in zip(steps, rows) if r[column] is not None and r[column] > 0]
        if points:
            ax.plot(*zip(*points), style, label=label)
    ax.set_yscale("log")
    return save_plot(fig, ax, path, f"run {run_id}: logprob gap", "step", "|learner logprob - behaviour logprob|")


# --- `streamrl show RUN`: the run's story ---------------------------------------------------

STORY_QUERIES = {
    "status": """
        select r.status, (select split_part(message, E'\\n', 1) from run_events f
                          where f.run_id = r.run_id and f.kind = 'failed' order by f.created_at desc limit 1) as why_it_failed
        from runs r where r.run_id = %(run)s""",
    "throughput": """
        select count(*) as steps, extract(epoch from max(created_at) - min(created_at)) as seconds,
               sum(samples) as trained_samples, sum(tokens) as trained_tokens, avg(seconds) as learner_seconds_per_step
        from train_steps where run_id = %(run)s""",
    "rollouts": """
        select count(*) as rollouts, extract(epoch from max(created_at) - min(created_at)) as seconds,
               count(*) filter (where error is not null) as failed, avg(num_tokens - prompt_length) as mean_response_tokens
        from trajectories where run_id = %(run)s and not is_val""",
    "staleness": """
        select staleness, count(*) filter (where status = 'trained') as trained,
               count(*) filter (where status = 'dropped') as dropped, count(*) filter (where status = 'pending') as pending
        from sample_staleness where run_id = %(run)s group by staleness order by staleness""",
    "logprob gap": """
        select count(*) as steps, avg(gap_mean) as mean, max(gap_max) as max,
               avg(gap_mean_lag0) as mean_lag0, max(gap_max_lag0) as max_lag0,
               avg(gap_mean_lag1) as mean_lag1, avg(gap_mean_lag2plus) as mean_lag2plus
        from logprob_gaps where run_id = %(run)s""",
    "filtered groups": """
        select reason, count(*) as groups, sum(received) as rollouts from filtered_groups
        where run_id = %(run)s group by reason order by reason""",
    "dead letters": """
        select stage, source_topic, count(*) as events, min(error) as example_error from dead_letters
        where run_id = %(run)s group by stage, source_topic order by events desc""",
}


def run_config(database_url: str, run_id: str) -> tuple[dict, str | None]:
    with connect(database_url, autocommit=True) as conn:
        row = conn.execute(
            "select config, parent_run_id from run_events where run_id = %s and kind = 'created'", (run_id,)
        ).fetchone()
    return (row[0] or {}, row[1]) if row else ({}, None)


def config_highlights(config: dict, parent: str | None) -> list[tuple[str, str]]:
    """The settings a reader of a run's story wants first."""

    def get(path: str):
        value: Any = config
        for key in path.split("."):
            value = value.get(key) if isinstance(value, dict) else None
        return value

    keys = [
        "experiment_name",
        "rollout_worker.model_path",
        "rollout_worker.rollout_repeat_n",
        "trajectory_pool.batch_size",
        "algorithm.type",
        "algorithm.policy_loss",
        "trainer.type",
        "trainer.lr",
        "trainer.lr_schedule",
        "trainer.total_train_steps",
        "trainer.warmup_cross_entropy_steps",
        "weight.sync_mode",
        "weight.staleness_threshold",
    ]
    rows = [("parent run", parent)] if parent else []
    rows += [(key, get(key)) for key in keys if get(key) is not None]
    replay = config.get("replay")
    if replay:
        rows += [(f"replay.{k}", v) for k, v in replay.items() if v is not None]
    return [(k, str(v)) for k, v in rows]


def story_sections(database_url: str, run_id: str) -> dict[str, tuple[list[str], list[tuple]]]:
    """Each section of the story as (columns, rows), straight from the ledger."""
    sections = {}
    with connect(database_url, autocommit=True) as conn:
        for name, query in STORY_QUERIES.items():
            cur = conn.execute(query, {"run": run_id})
            sections[name] = ([d.name for d in cur.description or []], cur.fetchall())
    return sections


def summary_table(summary: RunSummary, wall_s: float) -> Table:
    table = Table(title=Text(f"run {summary.run_id}"))
    table.add_column("measure")
    table.add_column("value", justify="right")
    if "warmup_steps" in summary.warmup:
        before = summary.warmup.get("val_accuracy_before_warmup")  # null where only workers can validate
        if before is not None:
            table.add_row("validation accuracy, untrained model", f"{before:.3f}")
        table.add_row(
            f"cross-entropy warm-up ({summary.warmup['warmup_steps']} steps)", f"{summary.warmup['warmup_seconds']:.0f} s"
        )
    if summary.val_accuracy:
        table.add_row("validation accuracy, first", f"{val_text(summary, 0)} (version {summary.val_versions[0]})")
        table.add_row("validation accuracy, last", f"{val_text(summary, -1)} (version {summary.val_versions[-1]})")
    if summary.reward_by_step:
        tail = summary.reward_by_step[-10:]
        table.add_row("train reward, last 10 steps", f"{sum(tail) / len(tail):.3f}")
    table.add_row("wall-clock", f"{wall_s:.0f} s")
    for key, value in summary.totals.items():
        table.add_row(key, f"{value:,.2f}" if value % 1 else f"{value:,.0f}")
    for key, value in summary.counts.items():
        table.add_row(key, f"{value:,}")
    return table


def print_failures(console: Console, database_url: str, run_id: str) -> None:
    """Every failure kind's count (the ledger's `failures` view), then the first of each
    verbatim with where it happened."""
    from streamrl.failures import first_errors_text, load_failures

    with connect(database_url, autocommit=True) as conn:
        failures = load_failures(conn, run_id)
    table = Table("kind", "count", title="failures")
    for kind, count in sorted(failures.counts.items(), key=lambda kv: -kv[1]):
        table.add_row(Text(visible(kind)), f"{count:,}")
    if not failures.counts:
        table.caption = "none"
    console.print(table)
    for line in first_errors_text(failures):
        console.print(Text(visible(line)))


def write_story(
    database_url: str, run_id: str, config: dict, parent: str | None, out: Path, width: int
) -> tuple[Path, list[Path], str]:
    """`streamrl show`: the story as report.html (with its plots) and the plots as PNGs
    under `out` (reward curve; logprob gap when recorded); returns their paths and the
    story as terminal text."""
    summary = load_summary(database_url, run_id)
    recorder = Console(record=True, width=max(width, 100))
    table = Table("setting", "value", title=f"run {run_id}: config")
    for key, value in config_highlights(config, parent):
        table.add_row(Text(visible(str(key))), Text(visible(str(value))))  # ledger text is text, not markup or controls
    recorder.print(table)
    recorder.print(summary_table(summary, summary.totals.get("first to last step (s)", 0.0)))
    for name, (columns, rows) in story_sections(database_url, run_id).items():
        section = Table(title=name)
        for column in columns:
            section.add_column(Text(visible(column)))
        for row in rows:
            cells = [plain_value(v) for v in row]
            section.add_row(*(Text("" if v is None else f"{v:.4g}" if isinstance(v, float) else visible(str(v))) for v in cells))
        if not rows:
            section.caption = "none"
        recorder.print(section)
    print_failures(recorder, database_url, run_id)
    pngs = [plot_reward_curve(summary, out / "reward_curve.png")]
    pngs += [p for p in [plot_logprob_gap(database_url, run_id, out / "logprob_gap.png")] if p]
    html = recorder.export_html(inline_styles=True)
    images = "".join(
        f'<img alt="{p.stem}" src="data:image/png;base64,{base64.b64encode(p.read_bytes()).decode()}">' for p in pngs
    )
    html = html.replace("</body>", f"{images}</body>")
    (out / "report.html").write_text(html)
    return out / "report.html", pngs, recorder.export_text(styles=True)
