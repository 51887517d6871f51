"""The guide's listing 001_09 (shared/seeds/001_*.txt, code block 9), as printed; only import lines differ."""
from tests.seed_examples.listings._helpers import compute_my_advantages

# my_custom_trainer.py
from streamrl.api import SelfHostedTrainer
from streamrl.api import Batch

class MyCustomTrainer(SelfHostedTrainer):
    """Custom trainer with my algorithm."""

    def __init__(self, config):
        super().__init__(config)
        # Initialize algorithm-specific components
        self._my_param = config.algorithm.get("my_param", 1.0)

    def _prepare_batch(self, batch: Batch) -> tuple[Batch, dict]:
        """
        Implement custom batch preparation logic.

        Args:
            batch: Batch from trajectory pool

        Returns:
            Tuple of (prepared_batch, metrics_dict)
        """
        metrics = {}

        # 1. Your preprocessing
        # ... remove padding, compute features ...

        # 2. Compute your algorithm-specific values
        # ... advantages, value estimates, etc ...
        batch.values["advantages"] = compute_my_advantages(batch)

        # 3. Log metrics
        metrics["my_algorithm/mean_advantage"] = batch.values["advantages"].mean().item()

        # 4. Return prepared batch and metrics
        return batch, metrics
