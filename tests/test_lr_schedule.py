"""The learning-rate schedule against hand-computed rates."""

import re

import pytest

from streamrl.algos.lr_schedule import learning_rate_at


def test_constant_schedule_keeps_the_rate():
    assert learning_rate_at(1, 100, 1e-3) == 1e-3
    assert learning_rate_at(100, 100, 1e-3) == 1e-3


def test_linear_warmup_then_linear_decay_to_the_floor():
    # warm-up over 10 steps: step 5 -> half the rate
    assert learning_rate_at(5, 110, 1.0, "linear", 0.1, warmup_steps=10) == pytest.approx(0.5)
    # after warm-up, 100 steps of decay from 1.0 to 0.1; step 60 is halfway: 0.1 + 0.9 * 0.5
    assert learning_rate_at(60, 110, 1.0, "linear", 0.1, warmup_steps=10) == pytest.approx(0.55)
    assert learning_rate_at(110, 110, 1.0, "linear", 0.1, warmup_steps=10) == pytest.approx(0.1)
    # past the end it stays at the floor
    assert learning_rate_at(500, 110, 1.0, "linear", 0.1, warmup_steps=10) == pytest.approx(0.1)


def test_cosine_decay_values():
    # progress 1/4: 0.5 * (1 + cos(pi/4)) = 0.853553...; floor 0 -> rate 0.853553
    assert learning_rate_at(25, 100, 1.0, "cosine") == pytest.approx(0.8535534, abs=1e-6)
    assert learning_rate_at(50, 100, 2.0, "cosine", 0.5) == pytest.approx(1.5)  # 2 * (0.5 + 0.5 * 0.5)
    assert learning_rate_at(100, 100, 2.0, "cosine", 0.5) == pytest.approx(1.0)


def test_unknown_schedule_names_the_key():
    with pytest.raises(ValueError, match=re.escape("trainer.lr_schedule")):
        learning_rate_at(1, 10, 1.0, "step")
