"""A StreamRL run laid out on hosts (tests/cluster/hosts.py) as docs/operations.md's
cluster page tells an operator to: each process started with its own command on its own
host, configured by host addresses alone.

    broker       streamrl up --only broker --listen ADDR      (the embedded broker, advertising ADDR)
    ledger       streamrl up --only ledger --listen ADDR      (PostgreSQL, password authentication)
    sink         streamrl sink --run RUN
    publisher    streamrl publish RECIPE --run RUN
    processor-N  streamrl processor RUN --name processor-N    (the faust app, a consumer group)
    worker-N     streamrl worker RUN --name worker-N          (a consumer group)
    learner-N    streamrl learner RUN --rdzv-endpoint LEARNER-1:29400 --local-addr ADDR

The compute hosts share one folder as STREAMRL_HOME (the volume a cluster mounts on
every learner and worker host: weight versions and snapshots live there); the broker and
the ledger keep their state on their own hosts. The ledger's password file and the bus
key reach the other hosts as secrets would: PGPASSFILE and STREAMRL_BUS_KEY.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.cluster.hosts import Hosts

REPO = Path(__file__).resolve().parents[2]
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "::1")
RDZV_PORT = 29400
KAFKA_PORT = 9092  # every host has its own ports: the defaults do
POSTGRES_PORT = 5432

# what a process inherits from this one; everything else it is given explicitly
INHERITED = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "OMP_WAIT_POLICY", "CI")


def layout(workers: int = 2, processors: int = 2, learners: int = 2) -> list[str]:
    return [
        "broker",
        "ledger",
        "sink",
        "publisher",
        *(f"processor-{i}" for i in range(1, processors + 1)),
        *(f"worker-{i}" for i in range(1, workers + 1)),
        *(f"learner-{i}" for i in range(1, learners + 1)),
    ]


@dataclass
class Process:
    host: str
    argv: list[str]
    env: dict[str, str]
    log: Path
    popen: subprocess.Popen
    expected_death: bool = False  # stopped or killed on purpose: its exit is not a failure

    def tail(self, lines: int = 30) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return "\n".join(text.splitlines()[-lines:])


@dataclass
class Deployment:
    hosts: Hosts
    root: Path  # this deployment's files: the hosts' homes, the shared volume, the secrets, the logs
    cores: int = 1  # torch threads a computing process may use (STREAMRL_CORES)
    processes: list[Process] = field(default_factory=list)
    bus_key: str = field(default_factory=lambda: secrets.token_hex(32))

    def __post_init__(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.root.chmod(0o755)  # the ledger's server runs as an unprivileged user and walks into it
        for folder in ("shared", "secrets", "logs"):
            (self.root / folder).mkdir(exist_ok=True)

    # --- addresses and configuration -------------------------------------------------
    def address(self, host: str) -> str:
        return self.hosts[host].address

    @property
    def bootstrap(self) -> str:
        return f"{self.address('broker')}:{KAFKA_PORT}"

    @property
    def database_url(self) -> str:
        return f"postgresql://streamrl@{self.address('ledger')}:{POSTGRES_PORT}/streamrl"

    @property
    def passfile(self) -> Path:
        return self.root / "secrets" / "ledger.pgpass"

    def service_env(self, host: str) -> dict[str, str]:
        """A broker's or ledger's host: its own STREAMRL_HOME, its own ports."""
        return {
            **self._inherited(),
            "STREAMRL_HOME": str(self.root / host),
            "STREAMRL_KAFKA_PORT": str(KAFKA_PORT),
            "STREAMRL_POSTGRES_PORT": str(POSTGRES_PORT),
            "STREAMRL_BUS_KEY": self.bus_key,
        }

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        """Every other host: the services by address, the secrets, the shared volume."""
        return {
            **self._inherited(),
            "STREAMRL_HOME": str(self.root / "shared"),
            "STREAMRL_KAFKA_BOOTSTRAP": self.bootstrap,
            "STREAMRL_DATABASE_URL": self.database_url,
            "PGPASSFILE": str(self.passfile),
            "STREAMRL_BUS_KEY": self.bus_key,
            "STREAMRL_PARTITION_ASSIGNMENT": "group",
            "STREAMRL_CORES": str(self.cores),
            **(extra or {}),
        }

    @staticmethod
    def _inherited() -> dict[str, str]:
        return {key: os.environ[key] for key in INHERITED if key in os.environ}

    def configuration_mentions_loopback(self) -> list[str]:
        """Every argument and variable a cluster process was given that names loopback."""
        found = []
        for process in self.processes:
            for word in process.argv:
                if any(name in word for name in LOOPBACK_NAMES):
                    found.append(f"{process.host}: argument {word}")
            for key, value in process.env.items():
                if key not in INHERITED and any(name in value for name in LOOPBACK_NAMES):
                    found.append(f"{process.host}: {key}={value}")
        return found

    # --- processes --------------------------------------------------------------------
    def start(self, host: str, *args: str, env: dict[str, str] | None = None, label: str | None = None) -> Process:
        """`streamrl ARGS` on `host`, in the background, its output in logs/."""
        argv = [sys.executable, "-m", "streamrl.cli", *args]
        environment = env if env is not None else self.env()
        log = self.root / "logs" / f"{label or host}-{len(self.processes)}.log"
        popen = subprocess.Popen(
            self.hosts.command(host, argv),
            env=environment,
            cwd=REPO,
            stdout=open(log, "wb"),
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        process = Process(host, argv, environment, log, popen)
        self.processes.append(process)
        return process

    def call(self, host: str, *args: str, env: dict[str, str] | None = None, timeout: float = 180) -> str:
        """`streamrl ARGS` on `host`, to its end; its output (an AssertionError with it if it failed)."""
        process = self.start(host, *args, env=env)
        try:
            code = process.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.popen.kill()
            raise AssertionError(f"streamrl {' '.join(args)} on {host} did not end in {timeout} s:\n{process.tail()}") from None
        if code != 0:
            raise AssertionError(f"streamrl {' '.join(args)} on {host} exited {code}:\n{process.tail()}")
        return process.log.read_text()

    def start_services(self) -> None:
        """The broker's and the ledger's hosts, then the password file handed to the others."""
        self.call("broker", "up", "--only", "broker", "--listen", self.address("broker"), env=self.service_env("broker"))
        self.call("ledger", "up", "--only", "ledger", "--listen", self.address("ledger"), env=self.service_env("ledger"))
        shutil.copy(self.root / "ledger" / "ledger.pgpass", self.passfile)
        self.passfile.chmod(0o600)

    def restart_broker(self) -> None:
        env = self.service_env("broker")
        self.call("broker", "down", env=env)
        self.call("broker", "up", "--only", "broker", "--listen", self.address("broker"), env=env)

    def restart_ledger(self) -> None:
        env = self.service_env("ledger")
        self.call("ledger", "down", env=env)
        self.call("ledger", "up", "--only", "ledger", "--listen", self.address("ledger"), env=env)

    def learner_args(self, run: str, host: str, nodes: int) -> list[str]:
        if nodes == 1:
            return ["learner", run]
        return [
            "learner",
            run,
            "--rdzv-endpoint",
            f"{self.address('learner-1')}:{RDZV_PORT}",
            "--local-addr",
            self.address(host),
        ]

    def start_run(
        self, recipe: str, run: str, overrides: list[str], publisher_env: dict[str, str], learner_nodes: int = 2
    ) -> None:
        """Sink, publisher (which creates the run), then the processors, workers and the
        learner's nodes (learner-1 .. learner-N, trainer.nnodes = N), each on its host,
        once the run's `created` event is in the ledger."""
        overrides = [*overrides, f"trainer.nnodes={learner_nodes}"]
        self.start("sink", "sink", "--run", run)
        self.start("publisher", "publish", recipe, *overrides, "--run", run, env=self.env(publisher_env))
        self.wait_for_ledger(
            lambda conn: conn.execute("select 1 from runs where run_id = %s", (run,)).fetchone(), 180, "the run's creation"
        )
        for host in self.hosts.hosts:
            if host.startswith("processor-"):
                self.start(host, "processor", run, "--name", host)
            elif host.startswith("worker-"):
                self.start(host, "worker", run, "--name", host)
            elif host.startswith("learner-") and int(host.split("-")[1]) <= learner_nodes:
                self.start(host, *self.learner_args(run, host, learner_nodes))

    def of_host(self, host: str) -> list[Process]:
        return [p for p in self.processes if p.host == host]

    def restart(self, processes: list[Process]) -> list[Process]:
        """The long-running commands of `processes`, started again on their hosts."""
        started = []
        for process in processes:
            args = process.argv[3:]
            if args and args[0] in ("worker", "processor", "sink", "learner"):
                started.append(self.start(process.host, *args, env=process.env))
        return started

    def stop_all(self) -> None:
        for process in self.processes:
            process.expected_death = True
        for process in self.processes:
            if process.popen.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.popen.pid, signal.SIGTERM)
        deadline = time.monotonic() + 30
        for process in self.processes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.popen.wait(timeout=max(0.1, deadline - time.monotonic()))
        for process in self.processes:
            if process.popen.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.popen.pid, signal.SIGKILL)

    # --- the ledger, read from the operator's console ------------------------------------
    def ledger(self):
        """A connection to the ledger from outside the cluster's hosts (the bridge's address)."""
        import psycopg

        return psycopg.connect(self.database_url, autocommit=True, connect_timeout=5, passfile=str(self.passfile))

    def wait_for_ledger(self, predicate, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(Exception), self.ledger() as conn:
                if predicate(conn):
                    return
            self.raise_if_a_process_failed()
            time.sleep(0.5)
        raise AssertionError(f"{what}: not in the ledger after {timeout} s\n{self.logs()}")

    def raise_if_a_process_failed(self) -> None:
        for process in self.processes:
            code = process.popen.poll()
            if code not in (None, 0) and not process.expected_death:
                raise AssertionError(f"{process.host}: `{' '.join(process.argv[3:])}` exited {code}:\n{process.tail()}")

    def logs(self, lines: int = 15) -> str:
        return "\n".join(f"--- {p.host} {' '.join(p.argv[3:5])} ({p.popen.poll()})\n{p.tail(lines)}" for p in self.processes)
