"""The guide's settings StreamRL cannot honour are refused with the guide's meaning named,
never accepted and ignored: `save_freq: 0` ("no checkpoints") and `tool_call_mode: xml`
(NexAU's XML call syntax)."""

from __future__ import annotations

import pytest

from streamrl.producers.agent_worker import guide_key_problems
from streamrl.runtime.recipe import RecipeError, load_recipe
from tests.conftest import REPO


def test_save_freq_zero_is_refused_with_the_guides_meaning(tmp_path):
    (tmp_path / "r.yaml").write_text("trainer: {save_freq: 0}\n")
    with pytest.raises(RecipeError) as refused:
        load_recipe(tmp_path / "r.yaml")
    assert 'trainer.save_freq: 0 (the guide\'s "no checkpoints") is not supported' in str(refused.value)
    with pytest.raises(RecipeError, match="no checkpoints"):
        load_recipe(REPO / "recipes" / "arith" / "recipe.yaml", ["trainer.save_freq=0"])


def test_xml_tool_calls_are_refused_not_parsed_as_json():
    assert guide_key_problems({"tool_call_mode": "openai"}) == []
    (problem,) = guide_key_problems({"tool_call_mode": "xml"})
    assert problem.startswith("tool_call_mode: only openai") and "NexAU's XML call syntax is not parsed" in problem
