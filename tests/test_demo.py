"""`streamrl demo`: a synthetic run through the real broker and the ledger sink."""

from tests.conftest import count_rows, run_cli


def test_demo_pushes_every_event_type_into_the_ledger(stack, ledger, run_id):
    result = run_cli("demo", "--run", run_id, "--rollouts", "16", timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    for table in ("tasks", "trajectories", "evaluations", "samples", "train_steps", "weight_versions",
                  "dead_letters"):
        assert count_rows(ledger, table, run_id) == 16, table
    assert "trajectories" in result.stdout and "(8 rows)" in result.stdout
