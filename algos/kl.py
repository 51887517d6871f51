"""KL to a frozen reference policy: estimators and coefficient controllers.

KL_ESTIMATORS (`algorithm.kl_estimator`), one signature:
    fn(log_ratio) -> per-token KL estimate,   log_ratio = log pi - log pi_ref
KL_CONTROLLERS (`algorithm.kl_ctrl.type`), one signature:
    cls(config) with `.kl_coef` and `.update(current_kl, n_steps)`;
    `config` is the recipe's `algorithm.kl_ctrl` section.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import torch

from streamrl.runtime.registry import Registry

if TYPE_CHECKING:
    from streamrl.runtime.config import KlControl

KlEstimatorFn = Callable[[torch.Tensor], torch.Tensor]
KL_ESTIMATORS: Registry[KlEstimatorFn] = Registry("KL estimator", "algorithm.kl_estimator")
register_kl_estimator = KL_ESTIMATORS.register


class KLController(Protocol):
    """What the learner reads of a controller: the coefficient now, and its update."""

    kl_coef: float

    def update(self, current_kl: float, n_steps: int) -> None: ...


KL_CONTROLLERS: Registry[type[Any]] = Registry("KL controller", "algorithm.kl_ctrl.type")
register_kl_controller = KL_CONTROLLERS.register


# --- estimators of KL(pi || pi_ref) from samples of pi (Schulman's k1, k2, k3) ----------


@register_kl_estimator("k1")
def kl_k1(log_ratio: torch.Tensor) -> torch.Tensor:
    """log pi - log pi_ref: unbiased, high variance, can be negative."""
    return log_ratio


@register_kl_estimator("k2")
def kl_k2(log_ratio: torch.Tensor) -> torch.Tensor:
    """(log pi - log pi_ref)^2 / 2: biased, low variance. A non-finite log-ratio (a -inf
    reference logprob on a masked position) keeps its value, inf, without a gradient: the
    square's gradient there is inf, and inf times the mask's 0 would be NaN."""
    finite = torch.isfinite(log_ratio)
    finite_part = torch.where(finite, log_ratio, torch.zeros((), dtype=log_ratio.dtype, device=log_ratio.device))
    return torch.where(finite, 0.5 * finite_part.square(), 0.5 * log_ratio.detach().square())


# verl's low-variance KL bounds: the log-ratio is clamped before exp (an exp of a
# log-ratio below -88.7 is inf in float32) and the estimate after it.
K3_LOG_RATIO_CLAMP = 20.0
K3_VALUE_CLAMP = 10.0


@register_kl_estimator("k3")
def kl_k3(log_ratio: torch.Tensor) -> torch.Tensor:
    """exp(-x) + x - 1 with x = log pi - log pi_ref clamped to +-20, the result clamped to
    [-10, 10] (verl's low_var_kl): unbiased and >= 0 inside the clamps, bounded outside,
    and no gradient past either clamp."""
    x = torch.clamp(log_ratio, -K3_LOG_RATIO_CLAMP, K3_LOG_RATIO_CLAMP)
    return torch.clamp(torch.exp(-x) + x - 1.0, -K3_VALUE_CLAMP, K3_VALUE_CLAMP)


@register_kl_estimator("k3+")
def kl_k3_straight_through(log_ratio: torch.Tensor) -> torch.Tensor:
    """k3's value with k2's gradient (straight-through, verl's `low_var_kl+`): k3's value
    is an unbiased estimate of the KL, but its gradient 1 - exp(-x) is not an unbiased
    estimate of the KL's gradient; k2's gradient x is (for samples of pi)."""
    k2 = kl_k2(log_ratio)
    # (k2 - sg(k2)) is exactly 0 in value; added to k3 last, it leaves k3's value exact
    # (k3 + k2 - k2 rounds at large log-ratios: 11 for 10 in bfloat16)
    return kl_k3(log_ratio).detach() + (k2 - k2.detach())


@register_kl_estimator("abs")
def kl_abs(log_ratio: torch.Tensor) -> torch.Tensor:
    """|log pi - log pi_ref|: biased, >= 0."""
    return log_ratio.abs()


def kl_penalty(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: str) -> torch.Tensor:
    """Per-token estimate of KL(pi || pi_ref) with the registered `estimator`."""
    return KL_ESTIMATORS.get(estimator)(logprobs - ref_logprobs)


def kl_reward_to_go(token_kl: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The KL-in-reward penalty as a per-token advantage term: the sum of the KL of this
    and every later trained token (the return of a -kl reward per token, gamma = 1)."""
    masked = torch.where(mask.bool(), token_kl, 0.0)  # selection: an inf on padding stays out
    return masked.flip(-1).cumsum(-1).flip(-1)


# --- coefficient controllers (Ziegler et al. 2019) ---------------------------------------


@register_kl_controller("fixed")
@dataclass
class FixedKLController:
    kl_coef: float

    @classmethod
    def from_config(cls, config: KlControl) -> FixedKLController:
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
    def from_config(cls, config: KlControl) -> AdaptiveKLController:
        return cls(config.kl_coef, config.target_kl, config.horizon)

    def update(self, current_kl: float, n_steps: int) -> None:
        proportional_error = min(max(current_kl / self.target_kl - 1.0, -0.2), 0.2)
        self.kl_coef *= 1.0 + proportional_error * n_steps / self.horizon


def make_kl_controller(config: KlControl) -> KLController:
    """The controller `config.type` names, built from the `algorithm.kl_ctrl` section."""
    controller: KLController = KL_CONTROLLERS.get(config.type).from_config(config)
    return controller
