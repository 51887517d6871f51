"""The guide's listing 003_02 (shared/seeds/003_*.txt, code block 2), as printed; only import lines differ."""

# recipe/my_task/my_remote_trainer.py
from streamrl.api import RemoteApiTrainer
from streamrl.api import Trajectory
from typing import Any

class MyRemoteTrainer(RemoteApiTrainer):
    """Custom trainer for remote API with custom algorithm."""

    def __init__(self, config):
        super().__init__(config)

        # Algorithm parameters
        self._advantage_weight = config.algorithm.get("advantage_weight", 1.0)

    def _prepare_trajectories(
        self, trajectories: list[Trajectory], metrics: dict[str, Any]
    ) -> list[Trajectory]:
        """Add custom fields to trajectories."""

        # 1. Group trajectories by run_id (if needed)
        groups = self._group_by_run_id(trajectories)

        # 2. Compute custom advantages
        for run_id, group in groups.items():
            # Your custom grouping/advantage logic
            group_advantages = self._compute_group_advantages(group)

            for traj, adv in zip(group, group_advantages):
                traj.advantage = adv * self._advantage_weight

        # 3. Log metrics
        avg_advantage = sum(t.advantage for t in trajectories) / len(trajectories)
        metrics["custom/advantage_mean"] = avg_advantage

        return trajectories

    def _group_by_run_id(self, trajectories: list[Trajectory]) -> dict:
        """Group trajectories by run_id."""
        groups = {}
        for traj in trajectories:
            run_id = traj.get("run_id", "default")
            if run_id not in groups:
                groups[run_id] = []
            groups[run_id].append(traj)
        return groups

    def _compute_group_advantages(self, group: list[Trajectory]) -> list[float]:
        """Compute advantages for a group of trajectories."""
        # Your custom advantage logic
        rewards = [traj.reward for traj in group]
        mean_reward = sum(rewards) / len(rewards)

        # Simple advantage: reward - mean
        advantages = [r - mean_reward for r in rewards]
        return advantages
