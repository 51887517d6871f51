"""The learning rate as a pure function of the step number.

A function of the step, not a stateful torch scheduler, so a resumed learner gets the
same rate from the checkpointed step alone.

    LR_SCHEDULES (`trainer.lr_schedule`), one signature:
        fn(progress) -> decay,   progress in [0, 1] after the warm-up, decay from 1 to 0
"""

from __future__ import annotations

import math
from collections.abc import Callable

from streamrl.runtime.registry import Registry

LR_SCHEDULES: Registry[Callable[[float], float]] = Registry("learning-rate schedule", "trainer.lr_schedule")
register_lr_schedule = LR_SCHEDULES.register


@register_lr_schedule("constant")
def constant_decay(progress: float) -> float:
    return 1.0


@register_lr_schedule("linear")
def linear_decay(progress: float) -> float:
    return 1.0 - progress


@register_lr_schedule("cosine")
def cosine_decay(progress: float) -> float:
    return 0.5 * (1.0 + math.cos(math.pi * progress))


def learning_rate_at(
    step: int, total_steps: int, base_lr: float, schedule: str = "constant", min_lr_ratio: float = 0.0, warmup_steps: int = 0
) -> float:
    """Rate for training step `step` (1-based): a linear ramp over `warmup_steps`, then
    `schedule` from `base_lr` down to `base_lr * min_lr_ratio` at `total_steps`."""
    if schedule not in LR_SCHEDULES:
        raise ValueError(f"trainer.lr_schedule: {LR_SCHEDULES.unknown(schedule)}")
    if warmup_steps > 0 and step <= warmup_steps:
        return base_lr * step / warmup_steps
    if schedule == "constant":
        return base_lr
    span = max(1, total_steps - warmup_steps)
    progress = min(1.0, max(0.0, (step - warmup_steps) / span))
    return base_lr * (min_lr_ratio + (1.0 - min_lr_ratio) * LR_SCHEDULES.get(schedule)(progress))
