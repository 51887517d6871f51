"""Every command's --help renders as written: no emoji ("A:B:" once became "A🅱"), no
stray markup, and every option of every command is described."""

import typer
from typer.testing import CliRunner

from streamrl.cli import app


def command_paths(command, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    paths = [prefix]
    if hasattr(command, "commands"):  # a group (typer vendors its own click)
        for name, sub in command.commands.items():
            paths += command_paths(sub, (*prefix, name))
    return paths


def test_every_help_text_is_plain_and_complete():
    runner = CliRunner()
    root = typer.main.get_command(app)
    paths = command_paths(root)
    assert ("replay",) in paths and ("db", "upgrade") in paths and ("recipe", "validate") in paths
    for path in paths:
        result = runner.invoke(app, [*path, "--help"], env={"COLUMNS": "200"})
        assert result.exit_code == 0, (path, result.output)
        text = result.output
        assert text.isascii(), (path, [c for c in text if not c.isascii()])
        for markup in ("[/", "[red]", "[bold", "[dim", "[green]", ":b:"):
            assert markup not in text, (path, markup)
    replay_help = runner.invoke(app, ["replay", "--help"], env={"COLUMNS": "200"}).output
    assert "A:B: only the source's steps A to B" in " ".join(replay_help.split())
    assert "auto|kafka|ledger" in replay_help  # typer checks the choice, not replay's body


def test_every_option_has_a_help_text():
    root = typer.main.get_command(app)
    missing = []
    for path in command_paths(root):
        command = root
        for name in path:
            command = command.commands[name]
        for param in command.params:
            if param.param_type_name == "option" and not param.help and "--help" not in param.opts:
                missing.append(f"streamrl {' '.join(path)} {param.opts[0]}")
    assert missing == []
