"""The guide's listing 003_05 (shared/seeds/003_*.txt, code block 5), as printed; only import lines differ."""
from streamrl.api import Batch

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
