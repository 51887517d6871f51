"""`streamrl demo`: a synthetic run through the real broker and the ledger sink."""

from tests.conftest import count_rows, run_cli


def test_demo_pushes_every_event_type_into_the_ledger(stack, ledger, run_id):
    result = run_cli("demo", "--run", run_id, "--rollouts", "16", timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    for table in ("tasks", "trajectories", "evaluations", "samples", "train_steps", "weight_versions", "dead_letters"):
        assert count_rows(ledger, table, run_id) == 16, table
    assert "trajectories" in result.stdout and "(8 rows)" in result.stdout


def test_replaying_a_run_whose_config_is_no_recipe_says_so(stack, ledger, run_id):
    assert run_cli("demo", "--run", run_id, "--rollouts", "4", timeout=300).returncode == 0
    result = run_cli("replay", run_id, "--into", f"{run_id}-again")
    assert result.returncode == 2
    assert f"run {run_id!r}: its recorded config is not a recipe of this version (unknown keys demo)" in " ".join(
        result.stderr.split()
    )
    assert "Traceback" not in result.stderr
