"""Dataset rows from jsonl or parquet files, with errors that name the file and line."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Iterator


class DatasetError(ValueError):
    pass


def read_rows(files: list[str], kind: str = "jsonl", required_keys: tuple[str, ...] = (),
              text_keys: tuple[str, ...] = ()) -> list[dict]:
    """Every row of `files`; each must hold `required_keys`, and `text_keys` as strings."""
    rows: list[dict] = []
    for name in files:
        path = Path(name)
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
                _check_keys(row, required_keys, text_keys, f"{path}:{number}")
                rows.append(row)
        elif kind == "parquet":
            import pyarrow.parquet as pq  # noqa: PLC0415  (only parquet recipes pay for pyarrow)
            for number, row in enumerate(pq.read_table(path).to_pylist(), start=1):
                _check_keys(row, required_keys, text_keys, f"{path}: row {number}")
                rows.append(row)
        else:
            raise DatasetError(f"data.type: expected jsonl or parquet, got {kind!r}")
    if not rows:
        raise DatasetError(f"{', '.join(files) or '(no data_files)'}: no rows")
    return rows


def _check_keys(row: dict, keys: tuple[str, ...], text_keys: tuple[str, ...], where: str) -> None:
    """The required keys are there, and the text keys hold text: the prompt a task
    carries is the column's text, and anything else (a list of chat messages, a number)
    is refused here rather than turned into its Python repr and trained on."""
    missing = [k for k in (*keys, *text_keys) if k not in row]
    if missing:
        raise DatasetError(f"{where}: row has no {', '.join(repr(k) for k in missing)} "
                           f"(keys: {', '.join(sorted(row)) or 'none'})")
    not_text = [k for k in text_keys if not isinstance(row[k], str)]
    if not_text:
        key = not_text[0]
        raise DatasetError(f"{where}: {key!r} holds a {type(row[key]).__name__}, not text: the prompt column must "
                           "be a string (chat-message prompts are not rendered with a chat template yet)")


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
    rows = len(read_rows(recipe.data.data_files, recipe.data.type)) if recipe.trainer.total_epochs else 0
    return recipe.total_train_steps(rows)
