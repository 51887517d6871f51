"""Every prompt's length in tokens, rendered as a single-turn worker renders it (the
run's tokenizer and chat template): `recipe validate` refuses the rows over the limit,
or, with `data.filter_overlong_prompts` (verl's key), `prepare_recipe` records them in
`data.skip_rows` so that every process of the run leaves the same rows out.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
from importlib import metadata
from pathlib import Path

from streamrl.runtime.dataset import lookup, read_rows
from streamrl.runtime.settings import Settings


def prompt_limit(recipe) -> int:
    """The smaller of data.max_prompt_length and rollout_worker.max_prompt_length."""
    return min(recipe.data.max_prompt_length, recipe.rollout_worker.max_prompt_length)


def renders_locally(recipe) -> bool:
    model_path = recipe.rollout_worker.model_path
    return bool(model_path) and (Path(model_path) / "tokenizer_config.json").is_file()


def prompt_lengths(recipe, rows: list[dict], prompt_key: str) -> list[int | str]:
    """Each row's prompt length, or the template's error for a row it refuses; read from
    the cache when the same prompts were rendered by the same tokenizer files, template
    settings and library versions before (a run checks its rows before it starts, and
    importing transformers to render them is most of that check's time)."""
    cache = Settings.from_env().home / "cache" / "prompt-lengths" / f"{lengths_key(recipe, rows, prompt_key)}.json"
    try:
        kept = json.loads(cache.read_text())
        if isinstance(kept, list) and len(kept) == len(rows):  # anything else (an edited file): render again
            return kept
    except (OSError, ValueError):
        pass
    lengths = rendered_lengths(recipe, rows, prompt_key)
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        partial = cache.with_suffix(f".{os.getpid()}.tmp")
        partial.write_text(json.dumps(lengths))
        partial.replace(cache)  # atomic: a reader sees all of it or none
    except OSError:  # a read-only home: the lengths are still right, only not kept
        pass
    return lengths


WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".h5", ".msgpack", ".onnx")


def lengths_key(recipe, rows: list[dict], prompt_key: str) -> str:
    """A digest of everything a prompt's rendered length depends on: the model folder's
    files other than weights (tokenizer, its config, a template file), the recipe's
    template keys, the date a template reads (today unless data.template_date pins it),
    the versions of the libraries that render and StreamRL's renderer's source, and the
    rows."""
    data = recipe.data
    digest = hashlib.sha256()
    template = [data.apply_chat_template, data.chat_template, data.chat_template_kwargs]  # a template file's text, read
    date = data.template_date or datetime.date.today().isoformat()
    versions = [metadata.version(name) for name in ("transformers", "tokenizers", "jinja2", "streamrl")]
    digest.update(json.dumps([template, date, versions, prompt_key], sort_keys=True, default=str).encode())
    digest.update(Path(__file__).with_name("chat_template.py").read_bytes())  # streamrl.runtime.chat_template
    folder = Path(recipe.rollout_worker.model_path)
    for path in sorted(folder.iterdir()):
        if path.is_file() and not path.name.endswith(WEIGHT_SUFFIXES):
            digest.update(path.name.encode() + b"\0" + hashlib.sha256(path.read_bytes()).digest())
    digest.update(json.dumps(rows, sort_keys=True, default=str).encode())
    return digest.hexdigest()


def rendered_lengths(recipe, rows: list[dict], prompt_key: str) -> list[int | str]:
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
