"""The guide's listing 003_10 (shared/seeds/003_*.txt, code block 10), as printed; only import lines differ."""
import torch
from streamrl.api import Batch

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
