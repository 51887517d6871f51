"""Recovery: a run whose processes are killed and whose embedded broker is restarted
(it keeps topics in memory, so everything on them is gone) is finished by
`streamrl run --resume RUN` from the ledger, and ends with the ledger of a run that never
failed: every task rolled out and evaluated once, every step trained once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from streamrl.runtime import services
from tests.cli_zygote import cli_popen
from tests.conftest import REPO, command_lines, run_cli, wait_for
from tests.test_rl_loop import assert_ledger_consistent, scalar, small_run_env

RECIPE = str(REPO / "recipes" / "arith" / "recipe.yaml")
STEPS = 12


def kill_run_processes(run_id: str, supervisor: int) -> int:
    """SIGKILL every process of the run (they run in their own sessions), as a machine's
    crash would, `streamrl run` (pid `supervisor`) last: its death sends its children
    SIGTERM, which would let them stop in order instead."""
    killed = 0
    for pid, args in sorted(command_lines().items(), key=lambda item: item[0] == supervisor):
        if "streamrl.cli" in args and run_id in args and pid != os.getpid():
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except ProcessLookupError:
                pass
    return killed


def log_tails(logs, lines: int = 15) -> str:
    return "\n".join(
        f"--- {log.name}\n" + "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
        for log in sorted(logs.glob("*.log"))
    )


def restart_broker(settings) -> None:
    state = settings.read_state()
    services.stop_embedded_kafka(state.pop("kafka"))
    settings.write_state(state)
    services.up(settings)


def test_resume_after_broker_restart_matches_a_run_without_the_fault(stack, ledger, run_id, tmp_path):
    env = {**os.environ, **small_run_env(ARITH_STEPS=str(STEPS), ARITH_WARMUP_STEPS="30", ARITH_VALIDATE_EVERY="6")}
    first = cli_popen(
        [sys.executable, "-m", "streamrl.cli", "run", RECIPE, "--run", run_id, "--out", str(tmp_path)],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(
            lambda: scalar(ledger, "select count(*) from train_steps where run_id = %s", run_id) >= 4,
            timeout=300,
            what="four trained steps",
        )
        assert first.poll() is None, f"the run ended by itself (code {first.poll()}):\n{log_tails(tmp_path / 'logs')}"
    finally:
        # streamrl run, and its publisher (maybe finished), sink, processor, learner and workers
        killed = kill_run_processes(run_id, supervisor=first.pid)
        first.wait()
    assert killed >= 5, log_tails(tmp_path / "logs")
    trained_before = scalar(ledger, "select count(*) from train_steps where run_id = %s", run_id)
    assert trained_before < STEPS

    restart_broker(stack)

    result = run_cli("run", "--resume", run_id, "--out", str(tmp_path), env=small_run_env(), timeout=420)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "topics re-created" in " ".join(result.stdout.split())

    # the counts of a run without the fault: 12 steps of 32 groups x 8, validation at 0, 6, 12
    assert scalar(ledger, "select count(*) from tasks where run_id = %s and not is_val", run_id) == STEPS * 32 * 8
    assert scalar(ledger, "select count(*) from tasks where run_id = %s and is_val", run_id) == 3 * 200
    assert scalar(ledger, "select count(*) from trajectories where run_id = %s", run_id) == STEPS * 32 * 8 + 3 * 200
    assert scalar(ledger, "select count(*) from evaluations where run_id = %s", run_id) == STEPS * 32 * 8 + 3 * 200
    assert (
        scalar(ledger, "select count(distinct trajectory_id) from trajectories where run_id = %s", run_id)
        == STEPS * 32 * 8 + 3 * 200
    )
    assert_ledger_consistent(ledger, run_id, steps=STEPS, staleness_threshold=1)
