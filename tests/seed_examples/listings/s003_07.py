"""The guide's listing 003_07 (shared/seeds/003_*.txt, code block 7), as printed; only import lines differ."""

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
