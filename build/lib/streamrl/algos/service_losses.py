"""The loss functions of the Tinker training API (`forward_backward(data, loss_fn)`), as
pure torch functions over one datum.

A datum is one sequence: `target_logprobs[t]` is log pi(target_tokens[t] | input[<=t])
under the weights being trained (with gradient); `inputs` are the datum's
`loss_fn_inputs` as float tensors of the same length. The API's losses are *sums* over
tokens (and over the datums of a request): a caller that wants a mean scales its
weights or advantages, as the Tinker documentation says.

    cross_entropy        -sum(weights * logp)                              inputs: weights
    importance_sampling  -sum(exp(logp - logp_sampler) * A)                inputs: logprobs, advantages
    ppo                  sum(max(-r A, -clip(r, low, high) A))             inputs: logprobs, advantages
    cispo                -sum(sg(clip(r, low, high)) * logp * A)           inputs: logprobs, advantages

`ppo` is StreamRL's own PPO-clip (`algos.losses.ppo_clip_token_loss`) with the API's
thresholds (`clip_low_threshold` 0.8, `clip_high_threshold` 1.2 by default) and no dual
clip, so the two paths train the same objective.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from streamrl.algos.losses import clamped_ratio, ppo_clip_token_loss
from streamrl.runtime.registry import Registry

# fn(target_logprobs [T], inputs {name: [T]}, config {name: value}) -> loss per token [T]
Inputs = dict[str, torch.Tensor]  # loss_fn_inputs by name, one value per token
LossConfig = dict[str, Any]  # the request's loss_fn_config
ServiceLossFn = Callable[[torch.Tensor, Inputs, LossConfig], torch.Tensor]
SERVICE_LOSSES: Registry[ServiceLossFn] = Registry("training-service loss", "loss_fn")
# Which loss_fn_inputs each loss needs (besides target_tokens), checked before a request runs.
REQUIRED_INPUTS: dict[str, tuple[str, ...]] = {}


def register_service_loss(name: str, inputs: tuple[str, ...]) -> Callable[[ServiceLossFn], ServiceLossFn]:
    REQUIRED_INPUTS[name] = inputs
    return SERVICE_LOSSES.register(name)


@register_service_loss("cross_entropy", ("weights",))
def cross_entropy_loss(target_logprobs: torch.Tensor, inputs: Inputs, config: LossConfig) -> torch.Tensor:
    """-weights * logp per token (the supervised loss; weights are 0 on the prompt)."""
    return -inputs["weights"] * target_logprobs


@register_service_loss("importance_sampling", ("logprobs", "advantages"))
def importance_sampling_loss(
    target_logprobs: torch.Tensor, inputs: dict[str, torch.Tensor], config: dict[str, Any]
) -> torch.Tensor:
    """-(pi / pi_sampler) * A per token: REINFORCE corrected for the sampler's policy."""
    return -clamped_ratio(target_logprobs, inputs["logprobs"]) * inputs["advantages"]


@register_service_loss("ppo", ("logprobs", "advantages"))
def ppo_loss(target_logprobs: torch.Tensor, inputs: Inputs, config: LossConfig) -> torch.Tensor:
    """PPO-clip against the sampler's logprobs, the ratio clipped to [low, high]."""
    low = float(config.get("clip_low_threshold", 0.8))
    high = float(config.get("clip_high_threshold", 1.2))
    loss, _ = ppo_clip_token_loss(
        target_logprobs,
        inputs["logprobs"],
        inputs["advantages"],
        clip_ratio_low=1.0 - low,
        clip_ratio_high=high - 1.0,
        clip_ratio_c=None,
    )
    return loss


@register_service_loss("cispo", ("logprobs", "advantages"))
def cispo_loss(target_logprobs: torch.Tensor, inputs: Inputs, config: LossConfig) -> torch.Tensor:
    """CISPO: the clipped ratio as a constant weight on the log-likelihood gradient."""
    low = float(config.get("clip_low_threshold", 0.8))
    high = float(config.get("clip_high_threshold", 1.2))
    weight = torch.clamp(clamped_ratio(target_logprobs, inputs["logprobs"]), low, high).detach()
    return -weight * target_logprobs * inputs["advantages"]
