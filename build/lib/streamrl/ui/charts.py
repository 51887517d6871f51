"""The run page's curves as Plotly figures, built here and drawn by plotly.js (served
from the plotly package itself, so the page needs no network).

One figure per measure, by step or by weight version; with a second run each figure
carries both, one trace per run.
"""

from __future__ import annotations

import plotly.graph_objects as go

from streamrl.ui.queries import Rows

# (figure id, title, column of CURVES or "accuracy" from VALIDATION)
CURVES = [
    ("reward", "reward (mean of the step's samples)", "reward"),
    ("val_accuracy", "validation accuracy", "accuracy"),
    ("loss", "loss", "loss"),
    ("kl", "KL to the reference", "kl"),
    ("entropy", "entropy", "entropy"),
    ("logprob_gap", "logprob gap (learner vs sampler, mean)", "logprob_gap"),
    ("staleness", "staleness (mean versions behind)", "staleness"),
    ("throughput", "throughput (trained tokens/s)", "tokens_per_s"),
]


def series(curves: Rows, validation: Rows, column: str, axis: str) -> tuple[list, list]:
    """(x, y) of one measure, without the steps that did not report it. Validation is
    measured per weight version; by step it is placed at the step that made the version
    (step s makes version s)."""
    if column == "accuracy":
        xs, ys = validation.column("weight_version"), validation.column("accuracy")
    else:
        xs = curves.column("weight_version" if axis == "version" else "step")
        ys = curves.column(column)
    kept = [(x, float(y)) for x, y in zip(xs, ys) if y is not None]
    return [x for x, _ in kept], [y for _, y in kept]


def figures(runs: list[tuple[str, Rows, Rows]], axis: str = "step") -> dict[str, str]:
    """{figure id: the figure as Plotly JSON} for each measure, one trace per run."""
    out = {}
    for figure_id, title, column in CURVES:
        figure = go.Figure()
        points = 0
        for run_id, curves, validation in runs:
            xs, ys = series(curves, validation, column, axis)
            points += len(xs)
            figure.add_trace(go.Scatter(x=xs, y=ys, mode="lines+markers" if len(xs) < 60 else "lines", name=run_id))
        if not points:  # e.g. KL in a recipe without a KL term: say so instead of an empty grid
            figure.add_annotation(
                text="not reported by this run",
                showarrow=False,
                xref="paper",
                yref="paper",
                x=0.5,
                y=0.5,
                font=dict(size=14, color="#777"),
            )
        figure.update_layout(
            title=title,
            height=300,
            margin=dict(l=50, r=20, t=40, b=40),
            showlegend=len(runs) > 1,
            xaxis_title="weight version" if axis == "version" or column == "accuracy" else "step",
            template="plotly_white",
        )
        out[figure_id] = figure.to_json()
    return out
