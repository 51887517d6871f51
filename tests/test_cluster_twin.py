"""The cluster twin's quick mode (CI's smoke test of bench/cluster_twin.py): the real
event path and ledger under modelled GPUs, sync against the deep fully-async schedule,
its steps training the groups published for them and the first groups to complete.
Its figures are measurements (docs/benchmarks.md); this checks that they are measured."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import REPO


def test_the_quick_twin_measures_both_schedules_on_real_payloads(stack, tmp_path):
    result = subprocess.run(
        [sys.executable, "bench/cluster_twin.py", "--quick", "--out", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "of the ideal schedule (target >= 90%)" in " ".join(result.stdout.split())
    sync, deep, first_complete = json.loads((tmp_path / "results.json").read_text())
    assert (sync["schedule"], deep["schedule"], first_complete["schedule"]) == ("sync", "fully-async", "fully-async")
    assert (deep["batch_groups"], first_complete["batch_groups"]) == ("published", "first_complete")
    for case in (sync, deep, first_complete):
        assert case["trained_per_s"] > 0 and case["generated_per_s"] > 0
        assert 0 < case["gpu_busy"] <= 1 and 0 < case["learner_busy"] <= 1
        assert 1 <= case["mean_batch"] <= case["model"]["max_running"]
        # real-sized payloads: a prompt of 512 tokens or more, its token ids and logprobs kept
        assert case["ledger_bytes_per_rollout"] > 512 * 8
        assert case["kafka_mb_per_s"]["trajectories"] > 0 and case["kafka_mb_per_s"]["samples"] > 0
        assert {"broker", "processor", "sink", "postgresql", "worker", "learner"} <= case["cpu_us_per_rollout"].keys()
    assert set(sync["staleness"]) == {"0"}  # sync trains on the newest version only
    assert max(int(k) for k in deep["staleness"]) <= 4  # the deep schedule's bound
    # a group trains at most k steps after the one it was published for: 2k versions behind
    assert max(int(k) for k in first_complete["staleness"]) <= 8
    assert (tmp_path / "cluster_twin.png").stat().st_size > 0
