"""A run that fails says so: failed rollouts are counted by kind with the first error
verbatim, a validation with nothing scored says n/a, and past the failure budget
`streamrl run` stops every process, exits 1 with the cause and the first error, and the
ledger marks the run failed."""

from __future__ import annotations

import psutil
import pytest

from streamrl.failures import StepRollouts, budget_breach
from streamrl.report import RunSummary, val_text
from streamrl.runtime.config import FailureBudget
from tests.cli_zygote import cli_popen
from tests.conftest import REPO, run_cli

RECIPE = str(REPO / "recipes" / "arith" / "recipe.yaml")
SMALL = {"ARITH_STEPS": "4", "ARITH_WARMUP_STEPS": "0", "ARITH_BATCH_PROMPTS": "4", "ARITH_SYNC_MODE": "sync"}


def steps(*rows: tuple[int, bool, int, int]) -> dict[tuple[int, bool], StepRollouts]:
    return {(step, is_val): StepRollouts(recorded, failed) for step, is_val, recorded, failed in rows}


def test_more_than_the_share_failed_in_one_step_breaches_before_the_step_is_complete():
    budget = FailureBudget(max_failed_share=0.5)
    # 32 rollouts a step: 16 failed is not more than half; 17 is, with 20 of 32 recorded
    assert budget_breach(steps((1, False, 32, 16)), 32, 10, budget) is None
    why = budget_breach(steps((1, False, 32, 16), (2, False, 20, 17)), 32, 10, budget)
    assert why == "17 of the 32 rollouts of step 2 failed, more than failure_budget.max_failed_share (0.5)"


def test_a_validation_with_every_rollout_failed_breaches():
    why = budget_breach(steps((0, True, 10, 10)), 32, 10, FailureBudget())
    assert why is not None and why.startswith("10 of the 10 rollouts of the validation of version 0 failed")


def test_steps_in_a_row_over_the_warning_share_breach_and_a_clean_step_resets_the_count():
    budget = FailureBudget(warn_share=0.1, max_steps_over_warn=3)
    # 20 a step: 3 failed is over 10%, 2 is not
    assert budget_breach(steps((1, False, 20, 3), (2, False, 20, 3), (3, False, 20, 2), (4, False, 20, 3)), 20, 5, budget) is None
    why = budget_breach(steps((1, False, 20, 2), (2, False, 20, 3), (3, False, 20, 3), (4, False, 20, 3)), 20, 5, budget)
    assert why is not None and why.startswith("3 steps in a row (steps 2 to 4) had more than failure_budget.warn_share (0.1)")
    incomplete = steps((2, False, 20, 3), (3, False, 20, 3), (4, False, 19, 3))  # step 4 not judged yet
    assert budget_breach(incomplete, 20, 5, budget) is None
    assert (
        budget_breach(steps((1, False, 20, 3), (2, False, 20, 3), (3, False, 20, 3)), 20, 5, FailureBudget(max_steps_over_warn=0))
        is None
    )


def test_the_progress_line_counts_failed_rollouts_and_the_other_kinds():
    from streamrl.failures import StepWatch

    watch = StepWatch(per_step=16, per_validation=4, steps=steps((1, False, 16, 2), (2, False, 10, 1), (0, True, 4, 4)))
    watch.kinds = {
        (1, False, "rollout error (TypeError)"): 2,
        (2, False, "evaluator error"): 1,
        (1, False, "truncated response"): 3,
        (2, False, "truncated response"): 4,
        (2, False, "dropped stale sample"): 5,
        (None, False, "dead letter"): 1,
        (0, True, "truncated response"): 9,
    }
    assert watch.note() == "failed 3/26 rollouts  truncated 7  stale dropped 5  dead letters 1"


def test_a_validation_accuracy_is_over_scored_rollouts_and_says_when_there_were_none():
    summary = RunSummary("r", val_versions=[0, 5], val_accuracy=[None, 0.75], val_counts=[16, 16], val_errored=[16, 4])
    assert val_text(summary, 0) == "n/a: 16 of 16 errored"
    assert val_text(summary, 1) == "0.750 (4 of 16 errored)"


RAISING_EVALUATOR = """
from streamrl.api import Evaluator


class Raising(Evaluator):
    def evaluate(self, data, evaluation_target):
        raise RuntimeError("the judge at 10.0.0.7 refused the connection")
"""


def failed_run(run_id: str, tmp_path, *overrides: str):
    result = run_cli("run", RECIPE, *overrides, "--run", run_id, "--out", str(tmp_path / "out"), env=SMALL, timeout=300)
    said = result.stdout + result.stderr
    assert not [p for p in psutil.process_iter(["cmdline"]) if run_id in " ".join(p.info["cmdline"] or [])]
    return result.returncode, said


@pytest.mark.services
def test_a_run_whose_evaluator_always_raises_exits_1_with_the_error_and_is_failed_in_the_ledger(stack, ledger, run_id, tmp_path):
    evaluator = tmp_path / "raising.py"
    evaluator.write_text(RAISING_EVALUATOR)
    code, said = failed_run(run_id, tmp_path, f"rollout_worker.evaluator_module_path={evaluator}:Raising")
    flat = " ".join(said.split())
    assert code == 1, said[-3000:]
    assert f"run {run_id} failed:" in flat and "failure_budget.max_failed_share (0.5)" in flat, flat[-3000:]
    assert "RuntimeError: the judge at 10.0.0.7 refused the connection" in flat, flat[-3000:]
    assert "evaluator error" in flat
    status, message = ledger.execute(
        "select r.status, e.message from runs r join run_events e on e.run_id = r.run_id and e.kind = 'failed' "
        "where r.run_id = %s",
        (run_id,),
    ).fetchone()
    assert status == "failed" and "refused the connection" in message
    kinds = dict(ledger.execute("select kind, count(*) from failures where run_id = %s group by kind", (run_id,)).fetchall())
    assert kinds.get("evaluator error", 0) > 0 and set(kinds) <= {"evaluator error", "truncated response"}, kinds

    shown = run_cli("show", run_id, "--out", str(tmp_path / "show"), timeout=120)
    text = " ".join(shown.stdout.split())
    assert shown.returncode == 0, shown.stderr[-2000:]
    assert "failed" in text and "evaluator error" in text, text[-3000:]
    assert "RuntimeError: the judge at 10.0.0.7 refused the connection" in text
    worker = ledger.execute("select worker_id from trajectories where run_id = %s limit 1", (run_id,)).fetchone()[0]
    assert f"the first, at {worker}, " in text and '"prompt":' in text  # where: the process, task and data row


@pytest.mark.services
def test_a_run_whose_prompts_are_too_long_is_refused_before_it_starts_naming_them(stack, ledger, run_id, tmp_path):
    """Every prompt is rendered before the run starts (`streamrl.data_checks`): none fits
    in 2 tokens, so the run is refused, nothing is recorded, and the rows are named."""
    result = run_cli(
        "run",
        RECIPE,
        "rollout_worker.max_prompt_length=2",
        "data.max_prompt_length=2",
        "--run",
        run_id,
        "--out",
        str(tmp_path / "out"),
        env=SMALL,
        timeout=300,
    )
    flat = " ".join((result.stdout + result.stderr).split())
    assert result.returncode == 2, flat[-3000:]
    assert "prompts are longer than max_prompt_length (2 tokens" in flat and "row 1 (" in flat, flat[-3000:]
    assert ledger.execute("select count(*) from runs where run_id = %s", (run_id,)).fetchone()[0] == 0


@pytest.mark.services
def test_a_run_whose_supervisor_gives_up_on_a_process_exits_1_and_is_failed_in_the_ledger(stack, ledger, run_id, tmp_path):
    """--max-restarts 0: the worker SIGKILLed after the first step is not restarted; the
    run stops, exits 1 naming the worker, and its status is failed, not left running."""
    import os
    import signal
    import subprocess
    import sys

    from tests.conftest import command_lines, wait_for_first_step

    run = cli_popen(
        [sys.executable, "-m", "streamrl.cli", "run", RECIPE, "--max-restarts", "0", "--run", run_id, "--out", str(tmp_path)],
        cwd=REPO,
        env={**os.environ, **SMALL, "ARITH_STEPS": "20"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_for_first_step(ledger, run_id, run)
        (worker,) = [pid for pid, args in command_lines().items() if "worker" in args and run_id in args and "run" not in args]
        os.kill(worker, signal.SIGKILL)
        said, _ = run.communicate(timeout=300)
    finally:
        if run.poll() is None:
            run.kill()
    flat = " ".join(said.split())
    assert run.returncode == 1, flat[-3000:]
    assert "worker-0 exited with code -9" in flat, flat[-3000:]
    status, message = ledger.execute(
        "select r.status, e.message from runs r join run_events e on e.run_id = r.run_id and e.kind = 'failed' where r.run_id = %s",
        (run_id,),
    ).fetchone()
    assert status == "failed" and "worker-0 exited with code -9" in message
