"""Dataset rows from jsonl, parquet or Hugging Face `datasets` folders, with errors that
name the file, the row and the key.

The row format (docs/data.md): the prompt is a string or a list of chat messages
(`{"role": "system" | "user" | "assistant" | "tool", "content": str}`), as verl's and
NexRL's parquet files hold it; any key a recipe names (`data.prompt_key`,
`data.answer_key`, an evaluator's) may be a dotted path into nested columns
(`reward_model.ground_truth`).
"""

from __future__ import annotations

import datetime
import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

CHAT_ROLES = ("system", "user", "assistant", "tool")
_MISSING = object()


class DatasetError(ValueError):
    pass


def lookup(row: dict, key: str, default: Any = _MISSING) -> Any:
    """`row[key]`, where a dotted key walks into nested mappings (`reward_model.ground_truth`).
    A column whose name holds the dot itself wins. Raises KeyError naming the part not found."""
    if key in row:
        return row[key]
    value: Any = row
    walked: list[str] = []
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            if default is not _MISSING:
                return default
            where = f" ({'.'.join(walked)!r} has no {part!r})" if walked else ""
            raise KeyError(f"row has no {key!r}{where}")
        value = value[part]
        walked.append(part)
    return value


def prompt_problem(prompt: Any) -> str | None:
    """Why `prompt` is neither text nor a list of chat messages (None when it is one)."""
    if isinstance(prompt, str):
        return None
    if not isinstance(prompt, list) or not prompt:
        return f"holds a {type(prompt).__name__}: a prompt is a string or a non-empty list of chat messages"
    for i, message in enumerate(prompt):
        if not isinstance(message, dict):
            return f"message {i} is a {type(message).__name__}, not a {{role, content}} mapping"
        if message.get("role") not in CHAT_ROLES:
            return f"message {i} has role {message.get('role')!r} (expected one of {', '.join(CHAT_ROLES)})"
        if not isinstance(message.get("content"), str):
            return f"message {i} ({message['role']}) has content of type {type(message.get('content')).__name__}, not text"
    return None


def read_rows(
    files: list[str], kind: str = "jsonl", required_keys: tuple[str, ...] = (), prompt_keys: tuple[str, ...] = ()
) -> list[dict]:
    """Every row of `files`; each must reach `required_keys` (dotted paths allowed), and
    `prompt_keys` must hold a prompt (text or chat messages)."""
    rows: list[dict] = []
    for name in files:
        path = Path(name)
        for where, row in _file_rows(path, kind):
            _check_keys(row, required_keys, prompt_keys, where)
            rows.append(row)
    if not rows:
        raise DatasetError(f"{', '.join(files) or '(no data_files)'}: no rows")
    return rows


def validation_rows(data_files: list[str], kind: str, max_rows: int | None, prompt_keys: tuple[str, ...] = ()) -> list[dict]:
    """The held-out rows every validation scores: the files' first `max_rows` (all where
    unset; none without files). The publisher, the learner and `streamrl run`, which
    waits for the last validation, all count them this way."""
    if not data_files:
        return []
    return read_rows(data_files, kind, prompt_keys=prompt_keys)[: max_rows or None]


EXTENSION_TYPES = {".jsonl": "jsonl", ".parquet": "parquet"}


def file_type(path: str, bases: tuple[Path, ...] = ()) -> str | None:
    """The data.type a file's extension (or a folder: hf) says, None when it says none;
    a relative path is looked for under `bases` too."""
    if any((base / path).is_dir() for base in (Path(), *bases)):
        return "hf"
    return EXTENSION_TYPES.get(Path(path).suffix.lower())


def data_type_problems(values: dict, bases: tuple[Path, ...] = ()) -> list[str]:
    """`data.type: auto` (the default) made the files' type, in place, so that every
    process reads the type the run recorded; files of several types, or of a type other
    than the one named, are refused."""
    problems = []
    for name in ("data", "validate.data"):
        section = values.get("data") or {} if name == "data" else (values.get("validate") or {}).get("data") or {}
        files = [str(f) for f in section.get("data_files") or []]
        kinds = {f: file_type(f, bases) for f in files}
        named = section.get("type", "auto")
        if named == "auto" and files:
            unknown = [f for f, kind in kinds.items() if kind is None]
            if unknown:
                problems.append(
                    f"{name}.type: auto cannot tell the type of {unknown[0]} from its extension: name it (jsonl, parquet or hf)"
                )
            elif len(set(kinds.values())) > 1:
                listed = ", ".join(f"{f}: {kind}" for f, kind in kinds.items())
                problems.append(f"{name}.data_files: files of several types ({listed}): one type per section")
            else:
                section["type"] = next(iter(kinds.values()))
        elif named != "auto":
            other = [f"{f} ({kind})" for f, kind in kinds.items() if kind not in (None, named)]
            if other:
                problems.append(f"{name}.type is {named}, and {', '.join(other[:3])} is not: fix the type or leave it auto")
    return problems


def _file_rows(path: Path, kind: str) -> Iterator[tuple[str, dict]]:
    if kind == "auto":
        kind = file_type(str(path)) or "jsonl"
    if kind == "hf":
        if not path.is_dir():
            raise DatasetError(f"{path}: not a folder (data.type hf reads what `datasets.Dataset.save_to_disk` wrote)")
        yield from _hf_rows(path)
        return
    if not path.is_file():
        raise DatasetError(f"{path}: data file not found")
    if kind == "jsonl":
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DatasetError(f"{path}:{number}: not valid JSON: {exc.msg}") from None
            if not isinstance(row, dict):
                raise DatasetError(f"{path}:{number}: expected a JSON object, got {type(row).__name__}")
            yield f"{path}:{number}", row
    elif kind == "parquet":
        import pyarrow.parquet as pq  # only parquet recipes pay for pyarrow

        for number, row in enumerate(pq.read_table(path).to_pylist(), start=1):
            yield f"{path}: row {number}", row
    else:
        raise DatasetError(f"data.type: expected jsonl, parquet or hf, got {kind!r}")


def _hf_rows(path: Path) -> Iterator[tuple[str, dict]]:
    try:
        import datasets  # only recipes with a datasets folder pay for it
    except ImportError:
        raise DatasetError(f"{path}: data.type hf needs the `datasets` package (pip install datasets)") from None
    try:
        loaded = datasets.load_from_disk(str(path))
    except (FileNotFoundError, ValueError) as exc:
        raise DatasetError(f"{path}: not a saved Hugging Face dataset: {exc}") from None
    if isinstance(loaded, datasets.DatasetDict):
        raise DatasetError(
            f"{path}: a DatasetDict with splits {', '.join(loaded)}: name one split's folder (e.g. {path / next(iter(loaded))})"
        )
    for number, row in enumerate(loaded, start=1):
        yield f"{path}: row {number}", dict(row)


def _check_keys(row: dict, keys: tuple[str, ...], prompt_keys: tuple[str, ...], where: str) -> None:
    """The required keys are reachable and the prompt keys hold a prompt: anything else
    (a number, a mapping, a malformed message) is refused here, not turned into its
    Python repr and trained on."""
    for key in (*keys, *prompt_keys):
        try:
            value = lookup(row, key)
        except KeyError as exc:
            raise DatasetError(f"{where}: {exc.args[0]} (columns: {', '.join(sorted(row)) or 'none'})") from None
        if key in prompt_keys and (problem := prompt_problem(value)):
            raise DatasetError(f"{where}: {key!r} {problem}")


def epoch_batches(rows: list[dict], batch_size: int, shuffle: bool, seed: int) -> Iterator[tuple[int, list[dict]]]:
    """(epoch, batch) forever: each epoch is a fresh permutation (seed + epoch), and a
    batch may span the end of one epoch and the start of the next, so every step has
    exactly `batch_size` rows. Deterministic, so a restarted publisher recomputes it."""
    epoch, buffer = 0, []
    while True:
        order = list(range(len(rows)))
        if shuffle:
            random.Random(seed + epoch).shuffle(order)
        for index in order:
            buffer.append(rows[index])
            if len(buffer) == batch_size:
                yield epoch, buffer
                buffer = []
        epoch += 1


def total_train_steps(recipe) -> int:
    """How many steps a run trains: the one function the publisher, the learner and
    `streamrl run` share (`Recipe.total_train_steps`, with the rows counted only when
    `trainer.total_epochs` makes the data's size matter)."""
    rows = len(training_rows(recipe.data)) if recipe.trainer.total_epochs else 0
    return recipe.total_train_steps(rows)


def data_section_problems(recipe) -> list[str]:
    """The validation rows are rendered and scored as the training rows are (one renderer
    and one evaluator per worker): validate.data may not set a chat template or an answer
    key of its own."""
    problems = []
    defaults: dict[str, Any] = {
        "apply_chat_template": "auto",
        "chat_template": None,
        "answer_key": "answer",
        "chat_template_kwargs": {},
        "template_date": None,
    }
    for key, default in defaults.items():
        value = getattr(recipe.validate.data, key)
        if value != getattr(recipe.data, key) and value != default:
            problems.append(
                f"validate.data.{key}: validation rows are rendered and scored as training rows are "
                f"(data.{key}); set it there only"
            )
    if recipe.data.template_date is not None:
        try:
            datetime.date.fromisoformat(recipe.data.template_date)
        except ValueError:
            problems.append(f"data.template_date: expected a date as YYYY-MM-DD, got {recipe.data.template_date!r}")
    if recipe.validate.data.filter_overlong_prompts or recipe.validate.data.skip_rows:
        problems.append(
            "validate.data.filter_overlong_prompts: every held-out row is scored (a filtered held-out set would "
            "change what its accuracy means); filter the training rows with data.filter_overlong_prompts"
        )
    return problems


def training_rows(data, required_keys: tuple[str, ...] = (), prompt_keys: tuple[str, ...] = ()) -> list[dict]:
    """The rows a run trains on: the data files' rows without `data.skip_rows` (the
    over-long prompts data.filter_overlong_prompts leaves out)."""
    rows = read_rows(data.data_files, data.type, required_keys, prompt_keys)
    if not data.skip_rows:
        return rows
    skip = set(data.skip_rows)
    kept = [row for index, row in enumerate(rows) if index not in skip]
    if not kept:
        raise DatasetError(f"{', '.join(data.data_files)}: every row's prompt is longer than max_prompt_length")
    return kept


def is_inline_template(value: str) -> bool:
    return "{{" in value or "{%" in value


def resolve_chat_template(value: str | None, bases: list[Path]) -> str | None:
    """`data.chat_template` as the template's text: a .jinja file is read (looked up in
    `bases`), a template's text kept. Raises DatasetError naming the key."""
    if not value or is_inline_template(value):
        return value
    for base in bases:
        if (base / value).is_file():
            return (base / value).read_text()
    raise DatasetError(
        f"data.chat_template: file not found: {value} (relative to "
        f"{' or '.join(str(b) for b in bases)}), and not a template's text"
    )


def saved_chat_template(model_path: str | None) -> str | None:
    """The chat template saved with a model folder (chat_template.jinja, or the
    tokenizer_config.json key older tokenizers use), read without loading the tokenizer."""
    if not model_path or not Path(model_path).is_dir():
        return None
    folder = Path(model_path)
    if (folder / "chat_template.jinja").is_file():
        return (folder / "chat_template.jinja").read_text()
    try:
        template = json.loads((folder / "tokenizer_config.json").read_text()).get("chat_template")
    except (OSError, ValueError):
        return None
    return template if isinstance(template, str) else None
