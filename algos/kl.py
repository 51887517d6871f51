"""KL to a frozen reference policy: estimators and coefficient controllers.

    KL_ESTIMATORS (`algorithm.kl_estimator`), one signature:
        fn(log_ratio) -> per-token KL estimate,   log_ratio = log pi - log pi_ref
    KL_CONTROLLERS (`algorithm.kl_ctrl.type`), one signature:
        cls(config) with `.kl_coef` and `.update(current_kl, n_steps)`;
        `config` is the recipe's `algorithm.kl_ctrl` section.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from runtime.registry import Registry

KlEstimatorFn = Callable[[torch.Tensor], torch.Tensor]
KL_ESTIMATORS: Registry[KlEstimatorFn] = Registry("KL estimator", "algorithm.kl_estimator")
register_kl_estimator = KL_ESTIMATORS.register

KL_CONTROLLERS: Registry[type] = Registry("KL controller", "algorithm.kl_ctrl.type")
register_kl_controller = KL_CONTROLLERS.register


# --- estimators of KL(pi || pi_ref) from samples of pi (Schulman's k1, k2, k3) ----------

@register_kl_estimator("k1")
def kl_k1(log_ratio: torch.Tensor) -> torch.Tensor:
    """log pi - log pi_ref: unbiased, high variance, can be negative."""
    return log_ratio


@register_kl_estimator("k2")
def kl_k2(log_ratio: torch.Tensor) -> torch.Tensor:
    """(log pi - log pi_ref)^2 / 2: biased, low variance."""
    return 0.5 * log_ratio.square()


@register_kl_estimator("k3")
def kl_k3(log_ratio: torch.Tensor) -> torch.Tensor:
    """exp(log pi_ref - log pi) - (log pi_ref - log pi) - 1: unbiased, >= 0."""
    return torch.exp(-log_ratio) + log_ratio - 1.0


def kl_penalty(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: str) -> torch.Tensor:
    """Per-token estimate of KL(pi || pi_ref) with the registered `estimator`."""
    return KL_ESTIMATORS.get(estimator)(logprobs - ref_logprobs)


def kl_reward_to_go(token_kl, mask):
    """The KL-in-reward penalty as a per-token advantage term: the sum of the KL of this
    and every later trained token (the return of a -kl reward per token, gamma = 1)."""
    masked = token_kl * mask
    return masked.flip(-1).cumsum(-1).flip(-1)


# --- coefficient controllers (Ziegler et al. 2019) ---------------------------------------

@register_kl_controller("fixed")
@dataclass
class FixedKLController:
    kl_coef: float

    @classmethod
    def from_config(cls, config) -> "FixedKLController":
        return cls(config.kl_coef)

    def update(self, current_kl: float, n_steps: int) -> None:
        pass


@register_kl_controller("adaptive")
@dataclass
class AdaptiveKLController:
    """kl_coef *= 1 + clip(kl / target - 1, -0.2, 0.2) * n_steps / horizon"""

    kl_coef: float
    target_kl: float
    horizon: int

    @classmethod
    def from_config(cls, config) -> "AdaptiveKLController":
        return cls(config.kl_coef, config.target_kl, config.horizon)

    def update(self, current_kl: float, n_steps: int) -> None:
        proportional_error = min(max(current_kl / self.target_kl - 1.0, -0.2), 0.2)
        self.kl_coef *= 1.0 + proportional_error * n_steps / self.horizon


def make_kl_controller(config):
    """The controller `config.type` names, built from the `algorithm.kl_ctrl` section."""
    return KL_CONTROLLERS.get(config.type).from_config(config)
