"""The guide's listing 001_12 (shared/seeds/001_*.txt, code block 12), as printed; only import lines differ."""
from tests.seed_examples.listings._helpers import logger

def _prepare_trajectories(self, trajectories, metrics):
    """Prepare trajectories with GRPO advantage computation."""
    from streamrl.api import compute_grpo_advantage_for_trajectories
    from streamrl.api import log_grpo_metrics

    # Compute GRPO advantages (groups by run_id)
    trajectories = compute_grpo_advantage_for_trajectories(
        trajectories, logger=logger, use_run_ids=True
    )

    # Log GRPO statistics
    log_grpo_metrics(trajectories, metrics)

    return trajectories
