"""Ledger text printed by the CLI cannot drive the terminal: a model's response holding
escape sequences (a window title, a clear screen, OSC 52's clipboard write) is shown with
its control characters written out, in tables, in `streamrl show`'s story and in `--csv`
to a terminal; `--csv` to a file keeps the data as it is."""

from __future__ import annotations

from streamrl.cli.common import console, print_table
from streamrl.runtime.sql import visible

HOSTILE = "42\x1b]0;owned\x07\x1b[2J\x1b]52;c;cm0gLXJmIH4=\x07\x9b\x7f"


def test_control_characters_are_written_out_and_tabs_and_newlines_kept():
    assert visible(HOSTILE) == "42\\x1b]0;owned\\x07\\x1b[2J\\x1b]52;c;cm0gLXJmIH4=\\x07\\x9b\\x7f"
    assert visible("a\tb\nc") == "a\tb\nc"


def test_a_table_of_ledger_rows_sends_no_control_character():
    with console.capture() as captured:
        print_table(["response\x1b[31m"], [(HOSTILE,), ({"nested": HOSTILE},)])
    out = captured.get()
    assert not any((ord(ch) < 32 and ch not in "\n") or 0x7F <= ord(ch) <= 0x9F for ch in out), repr(out)
    assert "\\x1b]0;owned" in out and "\\x1b[31m" in out
