"""The guide's listing 003_09 (shared/seeds/003_*.txt, code block 9), as printed; only import lines differ."""
from streamrl.api import Batch

def _prepare_batch(self, batch: Batch) -> tuple[Batch, dict]:
    metrics = {}

    # Compute things
    advantages = self._compute_advantages(batch)

    # Log statistics
    metrics["algorithm/advantage_mean"] = float(advantages.mean())
    metrics["algorithm/advantage_std"] = float(advantages.std())
    metrics["algorithm/advantage_max"] = float(advantages.max())

    return batch, metrics
