"""docs/cli.md, generated from the CLI itself: every command with its help, arguments
and options, as `--help` prints them (`python -m streamrl.cli.reference > docs/cli.md`;
tests/test_docs.py fails when the file is stale)."""

from __future__ import annotations

from typing import Any

import click
import typer


def command_help(command: Any, path: str) -> str:  # a click.Command (typer's bundled click)
    context = click.Context(command, info_name=path, terminal_width=100, max_content_width=100)
    return command.get_help(context)


def walk(group: Any, prefix: str):  # a click.Group (typer's bundled click)
    for name in sorted(group.commands):
        command = group.commands[name]
        if getattr(command, "hidden", False):
            continue
        path = f"{prefix} {name}"
        yield path, command
        if isinstance(command, click.Group):
            yield from walk(command, path)


def render() -> str:
    from streamrl.cli import app

    root = typer.main.get_command(app)
    lines = [
        "# Command-line reference",
        "",
        "Generated from the CLI (`python -m streamrl.cli.reference > docs/cli.md`); the same text",
        "as each command's `--help`.",
        "",
        "## streamrl",
        "",
        "```",
        command_help(root, "streamrl").rstrip(),
        "```",
        "",
    ]
    for path, command in walk(root, "streamrl"):
        lines += [f"## {path}", "", "```", command_help(command, path).rstrip(), "```", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    print(render(), end="")
