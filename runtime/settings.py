"""Where the services are: environment variables first, then what `streamrl up` started.

Every variable StreamRL reads is listed in `ENV_VARS` (docker-compose.yml sets the same
names; a test checks they agree).
"""

from __future__ import annotations

import functools
import json
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote, urlsplit, urlunsplit

ENV_VARS = {
    "STREAMRL_HOME": "state directory of the embedded services (default ./.streamrl)",
    "STREAMRL_KAFKA_BOOTSTRAP": "host:port[,host:port] of an external Kafka; unset: the embedded broker",
    "STREAMRL_DATABASE_URL": "postgresql://user:pass@host:port/db of an external PostgreSQL; unset: embedded",
    "STREAMRL_KAFKA_SECURITY_PROTOCOL": "PLAINTEXT (default), SSL, SASL_PLAINTEXT or SASL_SSL",
    "STREAMRL_KAFKA_SASL_MECHANISM": "PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512",
    "STREAMRL_KAFKA_SASL_USERNAME": "SASL user name",
    "STREAMRL_KAFKA_SASL_PASSWORD": "SASL password",
    "STREAMRL_KAFKA_SSL_CAFILE": "CA bundle for SSL",
    "STREAMRL_BUS_KEY": "the key events on the bus are signed with, 64 hex digits (default: STREAMRL_HOME/bus.key)",
    "STREAMRL_TOPIC_PARTITIONS": "partitions per run topic (default 4)",
    "STREAMRL_KAFKA_MAX_MESSAGE_BYTES": "largest message the broker accepts (default 1048576)",
    "STREAMRL_KAFKA_SESSION_TIMEOUT_MS": "consumer group session timeout (default 6000)",
    "STREAMRL_PARTITION_ASSIGNMENT": "group (default, except under `streamrl run`): rollout workers and "
    "processors share a run's partitions through Kafka consumer groups; "
    "shard: each takes a fixed --shard I/N (what `streamrl run`, which starts "
    "and restarts every process itself, uses unless this is set)",
    "STREAMRL_GROUP_MEMBERSHIP": "dynamic (default) or static: static members (KIP-345, named after the "
    "worker) get their partitions back on restart without a rebalance",
    "STREAMRL_KAFKA_PORT": "port of the embedded broker (default 9092, the next free one if taken)",
    "STREAMRL_POSTGRES_PORT": "port of the ledger's server `streamrl up --listen ADDR` starts (default 5432, the next "
    "free one if taken)",
    "STREAMRL_SERVICE_WAIT_S": "seconds a process waits for a lost broker or PostgreSQL before it gives up (default 120)",
    "STREAMRL_READONLY_DATABASE_URL": "the URL `streamrl sql`, `show`, `runs` and `replay --where` connect "
    "with (default: the ledger's URL as the streamrl_reader role)",
    "STREAMRL_CORES": "cores a run's computing processes split between them (default: every core this "
    "process may run on); set it when several runs or other work share the machine",
    "STREAMRL_SGLANG_PYTHON": "the Python of an SGLang environment, for managed inference servers "
    "(default: the one `make sglang-env` builds under ~/.cache/streamrl)",
}

# The SGLang release StreamRL is tested against (the Makefile's SGLANG_VERSION agrees).
SGLANG_VERSION = "0.5.23"

DEFAULT_KAFKA_PORT = 9092
DEFAULT_POSTGRES_PORT = 5432
STATE_FILE = "services.json"
SUPERVISED = "STREAMRL_SUPERVISED"  # set in the processes `streamrl run` starts and restarts
LEDGER_PASSFILE = "ledger.pgpass"  # runtime/ledger_server.py writes it on a cluster's ledger host
BUS_KEY_FILE = "bus.key"  # the key events are signed with (Settings.bus_key)


READER_ROLE = "streamrl_reader"  # created by migration 0007


def as_user(url: str, user: str) -> str:
    """`url` with its user replaced by `user` and no password."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:  # an IPv6 address
        host = f"[{host}]"
    netloc = f"{quote(user)}@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


EMBEDDED_CLUSTER_ID = "streamrl-embedded"  # the embedded broker's cluster id (runtime/services.py)


def broker_cluster_id(settings: Settings) -> str | None:
    """The broker's cluster id (None when it does not answer)."""
    from kafka import KafkaAdminClient

    try:
        admin = KafkaAdminClient(request_timeout_ms=10_000, **settings.kafka_client_options())
    except Exception:  # no broker: not the embedded one, as far as anyone can tell
        return None
    try:
        return admin.describe_cluster().get("cluster_id")
    except Exception:
        return None
    finally:
        admin.close()


class SettingsError(RuntimeError):
    """A setting is missing or malformed (the message names the variable)."""


def int_env(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise SettingsError(f"{name}={raw!r} is not an integer") from None
    if value <= 0:
        raise SettingsError(f"{name}={raw!r} must be positive")
    return value


def _choice_env(name: str, choices: tuple[str, ...]) -> str:
    """One of `choices` (the first when unset)."""
    raw = (os.environ.get(name) or choices[0]).strip().lower()
    if raw not in choices:
        raise SettingsError(f"{name}={raw!r}: expected {' or '.join(choices)}")
    return raw


@dataclass(frozen=True)
class Settings:
    home: Path
    kafka_bootstrap_env: str | None
    database_url_env: str | None
    security_protocol: str = "PLAINTEXT"
    sasl_mechanism: str | None = None
    sasl_username: str | None = None
    sasl_password: str | None = None
    ssl_cafile: str | None = None
    topic_partitions: int = 4
    max_message_bytes: int = 1_048_576
    session_timeout_ms: int = 6000
    partition_assignment: str = "group"
    group_membership: str = "dynamic"
    kafka_port: int = DEFAULT_KAFKA_PORT
    postgres_port: int = DEFAULT_POSTGRES_PORT
    sglang_python_env: str | None = None
    readonly_database_url_env: str | None = None
    service_wait_s: int = 120

    @functools.cached_property
    def bus_key(self) -> bytes | None:
        """The key every event on the bus is signed with (schema/signing.py):
        STREAMRL_BUS_KEY (64 hex digits), else STREAMRL_HOME/bus.key, which `streamrl up`
        writes; None where neither exists (frames are then neither signed nor checked)."""
        text = os.environ.get("STREAMRL_BUS_KEY") or None
        where = "STREAMRL_BUS_KEY"
        if text is None:
            path = self.home / BUS_KEY_FILE
            where = str(path)
            try:
                text = path.read_text().strip()
            except FileNotFoundError:
                return None
        try:
            key = bytes.fromhex(text)
        except ValueError:
            key = b""
        if len(key) < 16:
            raise SettingsError(f"{where}: expected a bus key of at least 32 hex digits (`streamrl up` writes one)")
        return key

    def ensure_bus_key(self) -> bool:
        """Write STREAMRL_HOME/bus.key (32 random bytes, readable by this user only) unless
        a key exists; True when it wrote one."""
        if self.bus_key is not None:
            return False
        self.home.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(self.home / BUS_KEY_FILE, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:  # another process wrote it first
            self.__dict__.pop("bus_key", None)
            return False
        with os.fdopen(fd, "w") as handle:
            handle.write(secrets.token_hex(32) + "\n")
        self.__dict__.pop("bus_key", None)
        return True

    @classmethod
    def from_env(cls) -> Settings:
        protocol = os.environ.get("STREAMRL_KAFKA_SECURITY_PROTOCOL", "PLAINTEXT").upper()
        if protocol not in ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"):
            raise SettingsError(
                f"STREAMRL_KAFKA_SECURITY_PROTOCOL={protocol!r}: expected PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL"
            )
        home = Path(os.environ.get("STREAMRL_HOME") or ".streamrl").absolute()
        if not os.environ.get("PGPASSFILE") and (home / LEDGER_PASSFILE).exists():
            # the ledger host's own password file (`streamrl up --listen` wrote it): libpq
            # reads the passwords from it, as it reads PGPASSFILE on the other hosts
            os.environ["PGPASSFILE"] = str(home / LEDGER_PASSFILE)
        return cls(
            home=home,
            kafka_bootstrap_env=os.environ.get("STREAMRL_KAFKA_BOOTSTRAP") or None,
            database_url_env=os.environ.get("STREAMRL_DATABASE_URL") or None,
            security_protocol=protocol,
            sasl_mechanism=os.environ.get("STREAMRL_KAFKA_SASL_MECHANISM") or None,
            sasl_username=os.environ.get("STREAMRL_KAFKA_SASL_USERNAME") or None,
            sasl_password=os.environ.get("STREAMRL_KAFKA_SASL_PASSWORD") or None,
            ssl_cafile=os.environ.get("STREAMRL_KAFKA_SSL_CAFILE") or None,
            topic_partitions=int_env("STREAMRL_TOPIC_PARTITIONS", 4),
            max_message_bytes=int_env("STREAMRL_KAFKA_MAX_MESSAGE_BYTES", 1_048_576),
            session_timeout_ms=int_env("STREAMRL_KAFKA_SESSION_TIMEOUT_MS", 6000),
            partition_assignment=_choice_env("STREAMRL_PARTITION_ASSIGNMENT", ("group", "shard")),
            group_membership=_choice_env("STREAMRL_GROUP_MEMBERSHIP", ("dynamic", "static")),
            kafka_port=int_env("STREAMRL_KAFKA_PORT", DEFAULT_KAFKA_PORT),
            postgres_port=int_env("STREAMRL_POSTGRES_PORT", DEFAULT_POSTGRES_PORT),
            sglang_python_env=os.environ.get("STREAMRL_SGLANG_PYTHON") or None,
            readonly_database_url_env=os.environ.get("STREAMRL_READONLY_DATABASE_URL") or None,
            service_wait_s=int_env("STREAMRL_SERVICE_WAIT_S", 120),
        )

    @property
    def readonly_database_url(self) -> str:
        """Where users' SQL runs: the ledger's database as the least-privileged
        `streamrl_reader` role the migrations create (no password), or the URL given."""
        if self.readonly_database_url_env:
            return self.readonly_database_url_env
        return as_user(self.database_url, READER_ROLE)

    @property
    def sglang_python(self) -> Path:
        """The Python that launches managed SGLang servers (SGLang lives in its own
        environment: it pins its own torch and CUDA packages)."""
        if self.sglang_python_env:
            return Path(self.sglang_python_env)
        return Path.home() / ".cache" / "streamrl" / f"sglang-{SGLANG_VERSION}" / "bin" / "python"

    # --- what `streamrl up` recorded -------------------------------------------------
    @property
    def state_path(self) -> Path:
        return self.home / STATE_FILE

    def read_state(self) -> dict:
        try:
            return json.loads(self.state_path.read_text())
        except FileNotFoundError:
            return {}
        except json.JSONDecodeError as exc:
            raise SettingsError(f"{self.state_path} is not valid JSON ({exc}); remove it and run `streamrl up`") from None

    def write_state(self, state: dict) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        tmp = self.state_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=2))
        tmp.replace(self.state_path)

    # --- the effective addresses -----------------------------------------------------
    @property
    def kafka_bootstrap(self) -> str:
        if self.kafka_bootstrap_env:
            return self.kafka_bootstrap_env
        embedded = self.read_state().get("kafka")
        if embedded:
            return embedded["bootstrap"]
        raise SettingsError("no Kafka broker: set STREAMRL_KAFKA_BOOTSTRAP or run `streamrl up` to start the embedded one")

    @functools.cached_property
    def embedded_kafka(self) -> bool:
        """True when the broker in use is the embedded one (Tansu, records in memory):
        started here by `streamrl up`, or on a cluster's broker host by `streamrl up
        --only broker --listen ADDR`, which every client can tell by its cluster id."""
        if self.kafka_bootstrap == (self.read_state().get("kafka") or {}).get("bootstrap"):
            return True
        return broker_cluster_id(self) == EMBEDDED_CLUSTER_ID

    @property
    def database_url(self) -> str:
        if self.database_url_env:
            return self.database_url_env
        embedded = self.read_state().get("postgres")
        if embedded:
            return embedded["url"]
        raise SettingsError("no PostgreSQL: set STREAMRL_DATABASE_URL or run `streamrl up` to start the embedded one")

    def kafka_client_options(self, bootstrap: str | None = None) -> dict:
        """Address and security options shared by every kafka-python client."""
        options: dict = {
            "bootstrap_servers": (bootstrap or self.kafka_bootstrap).split(","),
            "security_protocol": self.security_protocol,
        }
        if self.sasl_mechanism:
            options.update(
                sasl_mechanism=self.sasl_mechanism, sasl_plain_username=self.sasl_username, sasl_plain_password=self.sasl_password
            )
        if self.ssl_cafile:
            options["ssl_cafile"] = self.ssl_cafile
        return options
