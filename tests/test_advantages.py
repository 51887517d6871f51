"""Advantage estimators against values computed by hand."""

import numpy as np
import pytest

from streamrl.algos.advantages import (
    ADVANTAGE_ESTIMATORS,
    get_advantage_estimator,
    grpo_advantages,
    is_zero_variance,
    register_advantage,
)


def test_grpo_uses_the_sample_std():
    # mean 0.25; sample std = sqrt((0.75^2 + 3 * 0.25^2) / 3) = sqrt(0.25) = 0.5
    np.testing.assert_allclose(grpo_advantages([1, 0, 0, 0]), [1.5, -0.5, -0.5, -0.5], atol=1e-5)
    # mean 0.5; sample std = sqrt(4 * 0.25 / 3) = 0.57735; 0.5 / 0.57735 = 0.866025
    np.testing.assert_allclose(grpo_advantages([1, 0, 0, 1]), [0.866025, -0.866025, -0.866025, 0.866025], atol=1e-5)


@pytest.mark.parametrize(
    "name, rewards, expected",
    [
        ("dr_grpo", [1, 0, 0, 0], [0.75, -0.25, -0.25, -0.25]),
        ("dr_grpo", [2.0, 4.0], [-1.0, 1.0]),
        ("rloo", [1, 0, 0, 0], [1.0, -1 / 3, -1 / 3, -1 / 3]),
        ("rloo", [1, 0, 0, 1], [2 / 3, -2 / 3, -2 / 3, 2 / 3]),
        ("rloo", [3.0], [0.0]),
        ("grpo", [3.0], [0.0]),
        ("grpo", [0.5, 0.5, 0.5], [0.0, 0.0, 0.0]),
        ("reinforce", [1, 0, 2], [1.0, 0.0, 2.0]),
    ],
)
def test_estimators(name, rewards, expected):
    np.testing.assert_allclose(get_advantage_estimator(name)(np.array(rewards, dtype=float)), expected, atol=1e-6)


def test_zero_variance_groups():
    assert is_zero_variance([1.0, 1.0, 1.0])
    assert is_zero_variance([])
    assert not is_zero_variance([1.0, 0.0, 1.0])


def test_registry_is_extensible_and_names_what_it_knows():
    @register_advantage("test_constant")
    def constant(rewards):
        return np.ones(len(rewards))

    try:
        np.testing.assert_array_equal(get_advantage_estimator("test_constant")([5, 6]), [1, 1])
        with pytest.raises(ValueError, match="already registered"):
            register_advantage("test_constant")(constant)
        with pytest.raises(KeyError, match="unknown advantage estimator 'nope'; known: dr_grpo, grpo"):
            get_advantage_estimator("nope")
    finally:
        ADVANTAGE_ESTIMATORS.pop("test_constant")
