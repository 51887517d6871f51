"""Chapter "Custom Trainers": pattern 1 (SelfHostedTrainer._prepare_batch), pattern 2
(RemoteApiTrainer._prepare_trajectories), pattern 3 (an algorithm module), the KL
penalty, n-step returns and the edge-case advantage helper."""

from typing import Any

import torch

from streamrl.api import Batch, RemoteApiTrainer, SelfHostedTrainer, Trajectory


class MyCustomTrainer(SelfHostedTrainer):
    """Custom trainer implementing MyAlgorithm."""

    def __init__(self, config):
        super().__init__(config)

        # Algorithm-specific initialization
        self._my_param = config.algorithm.get("my_param", 0.5)
        self._use_custom_advantage = config.algorithm.get("use_custom_advantage", True)

    def _prepare_batch(self, batch: Batch) -> tuple[Batch, dict]:
        """Implement custom algorithm logic."""
        metrics = {}

        # 1. Log rollout metrics
        self._log_rollout_metrics(batch)

        # 2. Remove redundant padding (optional but recommended)
        batch = Batch.remove_redundant_left_padding(
            batch,
            pad_token_id=self._pad_token_id,
            anchor_field="input_ids",
            fields=["input_ids", "attention_mask", "position_ids", "loss_mask"]
        )

        # 3. Compute rewards
        rewards = self._compute_custom_rewards(batch)
        batch.values["token_level_scores"] = rewards

        # 4. Compute advantages (custom algorithm)
        if self._use_custom_advantage:
            batch = self._compute_custom_advantages(batch)
            metrics["advantage_mean"] = float(torch.mean(torch.tensor(batch.metadata["advantages"])))  # (a list here)

        # 5. Add any other custom fields
        batch.values["my_custom_field"] = self._compute_custom_field(batch)

        return batch, metrics

    def _compute_custom_advantages(self, batch: Batch) -> Batch:
        """Implement your advantage computation logic."""
        # Example: simple per-trajectory advantage
        rewards = batch.metadata["rewards"]
        advantages = []

        for reward in rewards:
            # Your custom advantage calculation
            advantage = reward * self._my_param
            advantages.append(advantage)

        # Store advantages in batch
        batch.metadata["advantages"] = advantages
        return batch

    def _compute_custom_rewards(self, batch: Batch) -> torch.Tensor:
        """Convert scalar rewards to token-level rewards."""
        # Similar to SelfHostedGrpoTrainer._reward_fn()
        rewards = batch.metadata["rewards"]
        loss_mask = batch.values["loss_mask"]

        reward_tensor = torch.zeros_like(loss_mask, dtype=torch.float32)

        for i, reward in enumerate(rewards):
            # Assign reward to last valid token
            valid_positions = torch.where(loss_mask[i] == 1)[0]
            if len(valid_positions) > 0:
                last_pos = valid_positions[-1]
                reward_tensor[i, last_pos] = reward

        return reward_tensor

    def _compute_custom_field(self, batch: Batch) -> torch.Tensor:
        """Add any custom processing."""
        # Your custom logic here
        return torch.zeros(len(batch))


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


# recipe/my_task/my_algorithm.py
def compute_my_advantages(
    batch: Batch,
    discount_factor: float = 0.99,
    gae_lambda: float = 0.95
) -> Batch:
    rewards = batch.metadata["rewards"]
    # Your algorithm implementation
    # ... (added here: a discounted outcome, the guide leaves it open)
    advantages = [reward * discount_factor * gae_lambda for reward in rewards]  # Computed advantages
    batch.metadata["advantages"] = advantages
    return batch


class MyTrainer(SelfHostedTrainer):
    def _prepare_batch(self, batch: Batch) -> tuple[Batch, dict]:
        metrics = {}

        # Use algorithm module
        batch = compute_my_advantages(
            batch,
            discount_factor=self._config.algorithm.discount_factor,
            gae_lambda=self._config.algorithm.gae_lambda
        )

        metrics["advantage_mean"] = float(torch.mean(torch.tensor(batch.metadata["advantages"])))  # (a list here)
        return batch, metrics


def _apply_kl_penalty(self, batch: Batch, beta: float) -> Batch:
    """Apply KL penalty to rewards."""
    # Compute KL divergence
    log_probs = batch.values["log_probs"]
    ref_log_probs = batch.values["ref_log_probs"]
    kl = log_probs - ref_log_probs

    # Apply penalty
    rewards = batch.values["token_level_scores"]
    penalized_rewards = rewards - beta * kl
    batch.values["token_level_scores"] = penalized_rewards

    return batch


def _compute_nstep_returns(
    self, rewards: list[float], n: int, gamma: float
) -> list[float]:
    """Compute n-step returns."""
    returns = []
    for i in range(len(rewards)):
        n_step_return = 0
        for j in range(min(n, len(rewards) - i)):
            n_step_return += (gamma ** j) * rewards[i + j]
        returns.append(n_step_return)
    return returns


def _compute_advantages(self, batch: Batch) -> torch.Tensor:
    """Compute advantages with proper handling."""
    rewards = batch.metadata["rewards"]

    # Handle empty batch
    if len(rewards) == 0:
        return torch.zeros(0)

    # Handle single sample (no std)
    if len(rewards) == 1:
        return torch.zeros(1)

    # Normal computation
    mean = torch.mean(rewards)
    std = torch.std(rewards)
    advantages = (rewards - mean) / (std + 1e-8)  # Avoid division by zero

    return advantages
