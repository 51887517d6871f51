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


class CpuMeter:
    """User + system CPU seconds so far of each role's processes (the broker and
    PostgreSQL serve every run on the machine: run nothing else beside a measurement).

    Read it at every poll: a process that has exited keeps the CPU of its last reading,
    since psutil cannot read a process that is gone (a learner trains its last step and
    exits between two polls; without its last reading its row would vanish or go
    negative)."""

    def __init__(self, run_id: str):
        self.run_id = run_id
        self.last: dict[tuple[int, float], tuple[str, float]] = {}  # (pid, start time) -> (role, CPU s)

    def read(self) -> dict[str, float]:
        for process in psutil.process_iter(["cmdline", "cpu_times", "create_time"]):
            args, times = process.info["cmdline"], process.info["cpu_times"]
            role = process_role(args, self.run_id) if args and times else None
            if role is not None:
                self.last[(process.pid, process.info["create_time"])] = (role, times.user + times.system)
        totals: dict[str, float] = {}
        for role, seconds in self.last.values():
            totals[role] = totals.get(role, 0.0) + seconds
        return totals


def per_step(before: dict[str, float], after: dict[str, float], steps: int) -> dict[str, float]:
    """CPU seconds a step of each role between two samples."""
    return {role: (after.get(role, 0.0) - before.get(role, 0.0)) / steps for role in after}
