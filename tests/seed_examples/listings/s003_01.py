"""The guide's listing 003_01 (shared/seeds/003_*.txt, code block 1), as printed; only import lines differ."""

# recipe/my_task/my_trainer.py
from streamrl.api import SelfHostedTrainer
from streamrl.api import Batch
import torch

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
            metrics["advantage_mean"] = float(torch.mean(batch.values["advantages"]))

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
