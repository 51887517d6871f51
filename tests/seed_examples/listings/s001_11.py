"""The guide's listing 001_11 (shared/seeds/001_*.txt, code block 11), as printed; only import lines differ."""
from typing import Any
from tests.seed_examples.listings._helpers import compute_feature, compute_my_metric

# my_remote_trainer.py
from streamrl.api import RemoteApiTrainer
from streamrl.api import Trajectory

class MyRemoteTrainer(RemoteApiTrainer):
    """Custom remote API trainer."""

    def _prepare_trajectories(
        self,
        trajectories: list[Trajectory],
        metrics: dict[str, Any]
    ) -> list[Trajectory]:
        """
        Prepare trajectories for remote API.

        Args:
            trajectories: List of trajectories from rollout
            metrics: Dictionary to populate with metrics

        Returns:
            Processed trajectories
        """
        # Your trajectory processing logic
        processed = []
        for traj in trajectories:
            # Compute custom features
            traj["custom_feature"] = compute_feature(traj)
            processed.append(traj)

        # Log metrics
        metrics["my_metric"] = compute_my_metric(processed)

        return processed
