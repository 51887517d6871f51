"""A chat template that reads the date (Llama 3.2's system header: "Today Date: ...",
from `strftime_now` or `date_string`) renders the run's recorded `data.template_date` in
every process, the day after, and in a replay of the run; and verl's
`apply_chat_template_kwargs` reach the template."""

from __future__ import annotations

import copy

from transformers import AutoTokenizer

from streamrl.runtime.chat_template import ChatRenderer, recipe_renderer
from streamrl.runtime.recipe import load_recipe, prepare_recipe
from tests.conftest import REPO

# the date lines of Llama 3.2's official template (written here: no package ships it)
DATED_TEMPLATE = (
    "{%- if not date_string is defined %}{%- if strftime_now is defined %}"
    '{%- set date_string = strftime_now("%d %b %Y") %}{%- else %}{%- set date_string = "26 Jul 2024" %}{%- endif %}'
    "{%- endif %}"
    "<|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\nToday Date: {{ date_string }}"
    "{% if enable_thinking is defined and not enable_thinking %} (no thinking){% endif %}<|eot_id|>"
    "{%- for m in messages %}<|start_header_id|>{{ m.role }}<|end_header_id|>\n\n{{ m.content }}<|eot_id|>{%- endfor %}"
)
RECIPE = REPO / "recipes" / "byo_math" / "recipe.yaml"


def tokenizer():
    return AutoTokenizer.from_pretrained(REPO / "recipes" / "byo_math" / "generated" / "model")


def test_the_template_renders_the_pinned_date_and_the_recipes_template_kwargs():
    pinned = ChatRenderer(tokenizer(), "true", DATED_TEMPLATE, {"enable_thinking": False}, date="2026-11-28")
    text = pinned.prompt_text("What is 2 + 2?")
    assert "Today Date: 28 Nov 2026 (no thinking)" in text
    assert "Today Date: 02 Mar 2025" in ChatRenderer(tokenizer(), "true", DATED_TEMPLATE, date="2025-03-02").prompt_text("?")


def test_a_run_records_its_date_and_a_replay_keeps_it():
    from streamrl.producers.replay import Plan, replay_config

    prepare_recipe(RECIPE)  # builds the stand-in model the tokenizer comes from
    recipe = load_recipe(RECIPE, ["data.template_date=2026-11-28", "data.chat_template_kwargs={enable_thinking: false}"])
    recipe.data.chat_template = DATED_TEMPLATE
    recorded = type(recipe).recorded(copy.deepcopy(recipe.to_dict()))  # as a process reads it from the ledger
    text = recipe_renderer(recorded, tokenizer()).prompt_text("What is 2 + 2?")
    assert "Today Date: 28 Nov 2026 (no thinking)" in text
    unpinned = prepare_recipe(RECIPE)
    assert unpinned.data.template_date is not None and len(unpinned.data.template_date) == 10  # today, recorded
    later = load_recipe(RECIPE, ["data.template_date=2027-01-01"])
    replay = replay_config(
        recorded,
        later,
        source_run="r",
        plan=Plan(steps=1),
        source="auto",
        steps=None,
        where=None,
        correction=None,
        recompute_advantages=None,
        rescore=None,
        rate=None,
    )
    assert replay.data.template_date == "2026-11-28"  # the recorded prompts' date, not the new recipe's


def test_verls_apply_chat_template_kwargs_is_the_recipes_chat_template_kwargs():
    recipe = load_recipe(RECIPE, ["data.apply_chat_template_kwargs={enable_thinking: false}"])
    assert recipe.data.chat_template_kwargs == {"enable_thinking": False}
