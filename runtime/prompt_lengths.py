"""Every prompt's length in tokens, rendered as a single-turn worker renders it (the
run's tokenizer and chat template): `recipe validate` refuses the rows over the limit,
or, with `data.filter_overlong_prompts` (verl's key), `prepare_recipe` records them in
`data.skip_rows` so that every process of the run leaves the same rows out.
"""

from __future__ import annotations

from pathlib import Path

from streamrl.runtime.dataset import lookup, read_rows


def prompt_limit(recipe) -> int:
    """The smaller of data.max_prompt_length and rollout_worker.max_prompt_length."""
    return min(recipe.data.max_prompt_length, recipe.rollout_worker.max_prompt_length)


def renders_locally(recipe) -> bool:
    model_path = recipe.rollout_worker.model_path
    return bool(model_path) and (Path(model_path) / "tokenizer_config.json").is_file()


def prompt_lengths(recipe, rows: list[dict], prompt_key: str) -> list[int | str]:
    """Each row's prompt length, or the template's error for a row it refuses."""
    from transformers import AutoTokenizer

    from streamrl.runtime.chat_template import recipe_renderer

    renderer = recipe_renderer(recipe, AutoTokenizer.from_pretrained(recipe.rollout_worker.model_path))
    lengths: list[int | str] = []
    for row in rows:
        try:
            lengths.append(len(renderer.prompt_ids(lookup(row, prompt_key))))
        except Exception as exc:  # a template's raise_exception, a malformed message: named with its row
            lengths.append(f"{type(exc).__name__}: {exc}")
    return lengths


def overlong_rows(recipe) -> list[int]:
    """The training rows (0-based, in file order) whose prompt is longer than the limit."""
    if recipe.rollout_worker.type != "single_turn" or not renders_locally(recipe):
        return []
    data = recipe.data
    lengths = prompt_lengths(recipe, read_rows(data.data_files, data.type, prompt_keys=(data.prompt_key,)), data.prompt_key)
    limit = prompt_limit(recipe)
    return [index for index, length in enumerate(lengths) if isinstance(length, int) and length > limit]
