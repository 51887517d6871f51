"""KL coefficient controllers (Ziegler et al. 2019): fixed, or adaptive towards a target KL."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class FixedKLController:
    kl_coef: float

    def update(self, current_kl: float, n_steps: int) -> None:
        pass


@dataclass
class AdaptiveKLController:
    """kl_coef *= 1 + clip(kl / target - 1, -0.2, 0.2) * n_steps / horizon"""

    kl_coef: float
    target_kl: float
    horizon: int

    def update(self, current_kl: float, n_steps: int) -> None:
        proportional_error = min(max(current_kl / self.target_kl - 1.0, -0.2), 0.2)
        self.kl_coef *= 1.0 + proportional_error * n_steps / self.horizon


def make_kl_controller(config: dict):
    if config.get("type", "fixed") == "adaptive":
        return AdaptiveKLController(config["kl_coef"], config["target_kl"], config["horizon"])
    if config.get("type", "fixed") != "fixed":
        raise ValueError(f"algorithm.kl_ctrl.type: expected fixed or adaptive, got {config.get('type')!r}")
    return FixedKLController(config["kl_coef"])


def kl_reward_to_go(token_kl, mask):
    """The KL-in-reward penalty as a per-token advantage term: the sum of the KL of this
    and every later trained token (the return of a -kl reward per token, gamma = 1)."""
    masked = token_kl * mask
    return masked.flip(-1).cumsum(-1).flip(-1)
