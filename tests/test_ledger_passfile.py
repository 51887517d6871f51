"""The cluster ledger's password file (runtime/ledger_server.py) reads back what it
writes, as libpq reads it: an IPv6 host's colons and a password's backslash escaped."""

from __future__ import annotations

from streamrl.runtime.ledger_server import pgpass_fields, read_passwords, write_passfile


def test_a_password_file_reads_back_what_it_wrote_for_an_ipv6_host(tmp_path):
    passfile = tmp_path / "ledger.pgpass"
    write_passfile(passfile, "fd00::12", 5432, {"streamrl": "owner:pass\\word", "streamrl_reader": "reader"})
    assert read_passwords(passfile) == {"streamrl": "owner:pass\\word", "streamrl_reader": "reader"}
    assert passfile.stat().st_mode & 0o077 == 0, "libpq ignores a password file others can read"
    first = passfile.read_text().splitlines()[0]
    assert first == "fd00\\:\\:12:5432:streamrl:streamrl:owner\\:pass\\\\word"
    assert pgpass_fields(first) == ["fd00::12", "5432", "streamrl", "streamrl", "owner:pass\\word"]
