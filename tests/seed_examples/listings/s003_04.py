"""The guide's listing 003_04 (shared/seeds/003_*.txt, code block 4), as printed; only import lines differ."""
import torch

# recipe/my_task/my_trainer.py
from streamrl.api import SelfHostedTrainer
from streamrl.api import Batch
from tests.seed_examples.listings.s003_03 import compute_my_advantages

class MyTrainer(SelfHostedTrainer):
    def _prepare_batch(self, batch: Batch) -> tuple[Batch, dict]:
        metrics = {}

        # Use algorithm module
        batch = compute_my_advantages(
            batch,
            discount_factor=self._config.algorithm.discount_factor,
            gae_lambda=self._config.algorithm.gae_lambda
        )

        metrics["advantage_mean"] = float(torch.mean(batch.metadata["advantages"]))
        return batch, metrics
