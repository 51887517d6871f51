"""What `recipe validate` (and every run) checks in the recipe's rows before anything
starts: each file reads, each prompt is text or chat messages the run can render, the
answer a built-in evaluator reads is there, and (where the model folder is local) every
prompt renders with the run's template within max_prompt_length tokens; every problem
with its file, row and key.
"""

from __future__ import annotations

from pathlib import Path

from streamrl.runtime.builtin_families import INIT_MARKER, STAMP_FILE
from streamrl.runtime.config import Data, Recipe
from streamrl.runtime.dataset import DatasetError, lookup, read_rows, saved_chat_template
from streamrl.runtime.prompt_lengths import prompt_lengths, prompt_limit, renders_locally


def data_problems(recipe: Recipe) -> list[str]:
    problems = []
    answer_key = evaluator_answer_key(recipe)
    sections = [("data", recipe.data)]
    if recipe.validate.data.data_files:
        sections.append(("validate.data", recipe.validate.data))
    for name, section in sections:
        try:
            rows = read_rows(
                section.data_files, section.type, (answer_key,) if answer_key else (), prompt_keys=(section.prompt_key,)
            )
        except DatasetError as exc:
            problems.append(f"{name}.data_files: {exc}")
            continue
        template = template_problems(recipe, name, section, rows)
        problems += template or render_problems(recipe, name, section, rows)
        problems += reward_rule_problems(recipe, name, section, rows)
    if recipe.trainer.warmup_messages_key and recipe.rollout_worker.type in ("agent", "nexau"):
        problems += warmup_tool_listing_problems(recipe)
    return problems


PRETRAINED_LR_LIMIT = 1e-4  # verl's and TRL's GRPO defaults are near 1e-6


def recipe_warnings(recipe: Recipe) -> list[str]:
    """What a run may do that the user likely did not mean; printed once by `run` and
    `recipe validate`, never refused."""
    warnings = []
    if recipe.data.skip_rows:
        warnings.append(
            f"data.filter_overlong_prompts: {len(recipe.data.skip_rows)} training rows have prompts longer than "
            f"{prompt_limit(recipe)} tokens and are left out (first: row {recipe.data.skip_rows[0] + 1})"
        )
    model_path, lr = recipe.rollout_worker.model_path, recipe.trainer.lr
    made_here = any((Path(model_path or ".") / name).is_file() for name in (INIT_MARKER, STAMP_FILE))
    if model_path and Path(model_path).is_dir() and not made_here and lr > PRETRAINED_LR_LIMIT:
        warnings.append(
            f"trainer.lr: {lr:g} fine-tunes {model_path}, a model `streamrl model init` did not make, at more than "
            f"{PRETRAINED_LR_LIMIT:g}: a pretrained model is usually trained near 1e-6 (verl's and TRL's GRPO defaults)"
        )
    return warnings


def evaluator_answer_key(recipe: Recipe) -> str | None:
    """The key a built-in evaluator reads the answer at (None for a recipe's own evaluator,
    which reads what it likes)."""
    worker = recipe.rollout_worker
    spec = worker.evaluator_module_path
    if spec and not spec.startswith("builtin:"):
        return None
    if spec in ("builtin:code", "builtin:weighted", "builtin:llm_judge"):  # an answer is optional there
        return worker.evaluator_kwargs.get("answer_key")
    return worker.evaluator_kwargs.get("answer_key", recipe.data.answer_key)


def reward_rule_problems(recipe: Recipe, name: str, section: Data, rows: list[dict]) -> list[str]:
    """`builtin:verl` picks its rule by each row's data source: a row whose source has no
    rule here would otherwise fail every one of its rollouts."""
    worker = recipe.rollout_worker
    if worker.evaluator_module_path != "builtin:verl":
        return []
    from streamrl.producers.verl_rules import UnknownDataSource, rule_for

    key = worker.evaluator_kwargs.get("data_source_key", "data_source")
    unknown: dict[str, list[int]] = {}
    for index, row in enumerate(rows):
        try:
            rule_for(lookup(row, key, None))
        except UnknownDataSource as exc:
            unknown.setdefault(str(exc), []).append(index + 1)
    return [
        f"{name}.data_files ({', '.join(section.data_files)}) {key}, rows {', '.join(map(str, lines[:SHOWN_ROWS]))}"
        f"{'...' if len(lines) > SHOWN_ROWS else ''} ({len(lines)} of {len(rows)}): {message}"
        for message, lines in unknown.items()
    ]


def template_problems(recipe: Recipe, name: str, section: Data, rows: list[dict]) -> list[str]:
    """Chat-message prompts need a chat template; a local model folder says whether it has one."""
    first = next((i for i, row in enumerate(rows) if not isinstance(lookup(row, section.prompt_key, ""), str)), None)
    if first is None:
        return []
    where = f"{name}.{section.prompt_key} (row {first + 1} of {section.data_files[0]}...)"
    if recipe.data.apply_chat_template is False:
        return [f"{where}: holds chat messages, and data.apply_chat_template is false (raw text only)"]
    model_path = recipe.rollout_worker.model_path
    if recipe.data.chat_template or not model_path or not Path(model_path).is_dir() or saved_chat_template(model_path):
        return []
    return [
        f"{where}: holds chat messages, and the tokenizer in {model_path} has no chat template "
        "(set data.chat_template to a .jinja file)"
    ]


SHOWN_ROWS = 3  # rows named per problem; the rest are counted


def render_problems(recipe: Recipe, name: str, section: Data, rows: list[dict]) -> list[str]:
    """Every prompt rendered as a single-turn worker renders it (the run's tokenizer and
    template): a row the template refuses is named with the template's message, and rows
    longer than max_prompt_length are counted and the first named, unless the training
    rows are filtered (data.filter_overlong_prompts: `recipe_warnings` counts them). An
    agent's prompt also lists its tools, so for agents only the template's refusals are
    checked."""
    if not rows or not renders_locally(recipe):
        return []  # a hub id or a remote model: nothing local to render with
    lengths = prompt_lengths(recipe, rows, section.prompt_key)
    limit = prompt_limit(recipe)
    filtered = name == "data" and recipe.data.filter_overlong_prompts
    check_length = recipe.rollout_worker.type == "single_turn" and not filtered
    refused = [f"row {i + 1}: {length}" for i, length in enumerate(lengths) if isinstance(length, str)]
    over_long = [
        f"row {i + 1} ({length} tokens)"
        for i, length in enumerate(lengths)
        if check_length and isinstance(length, int) and length > limit
    ]
    where = f"{name}.{section.prompt_key} ({', '.join(section.data_files)})"
    problems = []
    if refused:
        problems.append(
            f"{where}: the chat template refused {len(refused)} of {len(rows)} prompts: {'; '.join(refused[:SHOWN_ROWS])}"
        )
    if over_long:
        remedy = "" if name != "data" else "; or leave them out with data.filter_overlong_prompts: true"
        problems.append(
            f"{where}: {len(over_long)} of {len(rows)} prompts are longer than max_prompt_length ({limit} tokens, the "
            f"smaller of data.max_prompt_length and rollout_worker.max_prompt_length): "
            f"{', '.join(over_long[:SHOWN_ROWS])}{remedy}"
        )
    return problems


def warmup_tool_listing_problems(recipe: Recipe) -> list[str]:
    """Demonstrations are laid out without the tool listing: an agent that lists its tools
    in the prompt would be warmed up on prompts it never sees."""
    from streamrl.producers.agent_worker import AgentConfigError, load_agent_config

    path = recipe.rollout_worker.agent_config_path
    if path is None:
        return []  # reported with the agent config's own key
    try:
        config = load_agent_config(path)
    except (AgentConfigError, TypeError):
        return []  # reported with the agent config's own key
    if config.get("tools") and config.get("tools_in_system_prompt", True):
        return [
            "trainer.warmup_messages_key: demonstrations are rendered without the tool listing, and the agent "
            "lists its tools in the prompt (tools_in_system_prompt); set it false, or warm up without "
            "demonstrations"
        ]
    return []
