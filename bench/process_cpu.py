"""CPU time of a run's processes by the part each plays (psutil), for the benchmarks
that charge a step's CPU to its processes."""

from __future__ import annotations

from pathlib import Path

import psutil


def process_role(args: list[str], run_id: str) -> str | None:
    """The part of the run a process plays, from its command line (a child that `streamrl
    run` forked shows its command line as one title: split into its words here)."""
    args = " ".join(args).split()
    if "streamrl.cli" in args and run_id in args:
        role = args[args.index("streamrl.cli") + 1]
        return "orchestrator" if role == "run" else role  # workers share one row
    name = Path(args[0]).name if args else ""
    if name.startswith("tansu"):
        return "broker"
    if name.startswith("postgres") or (args and args[0].startswith("postgres:")):
        return "postgresql"
    return None


def cpu_by_role(run_id: str) -> dict[str, float]:
    """User + system CPU seconds so far of each role's processes (the broker and
    PostgreSQL serve every run on the machine: run nothing else beside a measurement)."""
    totals: dict[str, float] = {}
    for process in psutil.process_iter(["cmdline", "cpu_times"]):
        args, times = process.info["cmdline"], process.info["cpu_times"]
        role = process_role(args, run_id) if args and times else None
        if role is not None:
            totals[role] = totals.get(role, 0.0) + times.user + times.system
    return totals


def per_step(before: dict[str, float], after: dict[str, float], steps: int) -> dict[str, float]:
    """CPU seconds a step of each role between two samples."""
    return {role: (after.get(role, 0.0) - before.get(role, 0.0)) / steps for role in after}
