"""Real services for the tests: the embedded broker and embedded PostgreSQL, started
once per session under a temporary STREAMRL_HOME with `runtime.services.up`, exactly
as `streamrl up` does. Every test uses its own run id, so tests never see each
other's events."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
import warnings
from pathlib import Path

import pytest

from streamrl.producers.sglang_server import ManagedServer
from streamrl.runtime import db, services
from streamrl.runtime.recipe import prepare_recipe
from streamrl.runtime.settings import Settings
from streamrl.runtime.threads import usable_cores
from tests.cli_zygote import cli_popen

REPO = Path(__file__).resolve().parent.parent

# The suite runs its runs side by side (one per pytest-xdist worker): each run's
# processes split a worker's share of the cores, not the whole machine (runtime/threads.py).
if not os.environ.get("STREAMRL_CORES"):
    _workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 1)
    os.environ["STREAMRL_CORES"] = str(max(1, usable_cores() // _workers))


@pytest.fixture(scope="session")
def stack():
    # Outside pytest's temp root: a second pytest session resets that root's mode, and
    # the embedded PostgreSQL (which runs as an unprivileged user when the tests run as
    # root) would lose its data directory under the first session's feet.
    home = Path(tempfile.mkdtemp(prefix="streamrl-test-home-"))
    home.chmod(0o755)
    env = {"STREAMRL_HOME": str(home)}
    saved = {k: os.environ.get(k) for k in ("STREAMRL_HOME", "STREAMRL_KAFKA_BOOTSTRAP", "STREAMRL_DATABASE_URL")}
    os.environ.update(env)
    os.environ.pop("STREAMRL_KAFKA_BOOTSTRAP", None)
    os.environ.pop("STREAMRL_DATABASE_URL", None)
    os.environ["STREAMRL_KAFKA_PORT"] = str(free_port())
    settings = Settings.from_env()
    services.up(settings)
    db.upgrade(settings.database_url)
    yield settings
    services.down(settings)
    shutil.rmtree(home, ignore_errors=True)
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture
def run_id():
    return f"test-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def ledger(stack):
    conn = db.connect(stack.database_url, autocommit=True)
    yield conn
    conn.close()


def count_rows(conn, table: str, run_id: str) -> int:
    return conn.execute(f"select count(*) from {table} where run_id = %s", (run_id,)).fetchone()[0]


def free_port() -> int:
    """A port the OS says is free now: tests never collide with each other, a second
    suite or a user's services on a fixed port."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def broker_topics(settings, run_id: str) -> set[str]:
    """Which of the run's topics (plain and windows) the broker lists."""
    from kafka import KafkaAdminClient

    from streamrl.schema.topics import existing_run_topics

    admin = KafkaAdminClient(**settings.kafka_client_options())
    try:
        return set(existing_run_topics(run_id, admin.list_topics()))  # window topics too
    finally:
        admin.close()


def committed_offsets(settings, group: str) -> dict[tuple[str, int], int]:
    """The offsets consumer group `group` has committed, by (topic, partition)."""
    from kafka import KafkaAdminClient

    admin = KafkaAdminClient(**settings.kafka_client_options())
    try:
        offsets = admin.list_group_offsets({group: None}).get(group, {})
        return {(tp.topic, tp.partition): meta.offset for tp, meta in offsets.items()}
    finally:
        admin.close()


def topic_ends(settings, topic: str) -> dict[tuple[str, int], int]:
    """Each partition's end offset (exact for topics written one record per batch:
    the embedded broker reports the base offset of the last batch + 1)."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(**settings.kafka_client_options())
    try:
        partitions = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic) or ()]
        return {(tp.topic, tp.partition): end for tp, end in consumer.end_offsets(partitions).items()}
    finally:
        consumer.close()


def ledger_read_to(conn, ends: dict[tuple[str, int], int]) -> bool:
    """Whether the ledger's sink has written every partition in `ends` up to its offset."""
    rows = conn.execute("select topic, partition, max(next_offset) from consumer_offsets group by topic, partition")
    written = {(topic, partition): offset for topic, partition, offset in rows}
    return all(written.get(key, 0) >= end for key, end in ends.items())


def run_cli(*args: str, env: dict | None = None, timeout: float = 120, check: bool = False):
    """Run the real `streamrl` CLI in a subprocess: `python -m streamrl.cli ARGS`, forked
    from the worker's zygote (cli_zygote.py), which has imported it already."""
    with cli_popen(
        [sys.executable, "-m", "streamrl.cli", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
        cwd=REPO,
    ) as process:
        try:
            stdout, stderr = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate()
            raise
    result = subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)
    if check and result.returncode != 0:
        raise AssertionError(f"streamrl {' '.join(args)} exited {result.returncode}:\n{result.stderr}")
    return result


def start_sink_process(run_id: str, *extra: str, ready: bool = False) -> subprocess.Popen:
    """`streamrl sink` for `run_id`; `ready`: returns once it says it is running (its
    SIGTERM handler is in place from then on)."""
    sink = cli_popen(
        [sys.executable, "-m", "streamrl.cli", "sink", "--run", run_id, *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    if ready:
        said = read_until(sink, "sink running", timeout=120)
        assert "sink running" in said, f"the sink did not start: {said}{sink.stderr.read() if sink.poll() is not None else ''}"
    return sink


def read_until(process: subprocess.Popen, text: str, timeout: float) -> str:
    """What `process` writes to stdout (a text pipe) up to and including the first line
    holding `text`; less when it ends or `timeout` passes first."""
    lines: list[str] = []
    found = threading.Event()

    def read() -> None:
        for line in process.stdout:
            lines.append(line)
            if text in line:
                found.set()
                return
        found.set()  # the end of its output

    threading.Thread(target=read, daemon=True).start()
    found.wait(timeout)
    return "".join(lines)


def fresh_database(settings, prefix: str) -> str:
    """The URL of a new, migrated database on the session's PostgreSQL: a training service
    started on it restores no other module's sessions (a service restores every open
    session of its ledger before it answers)."""
    from urllib.parse import urlsplit, urlunsplit

    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    with db.connect(settings.database_url, autocommit=True) as conn:
        conn.execute(f'create database "{name}"')
    url = urlunsplit(urlsplit(db.psycopg_url(settings.database_url))._replace(path=f"/{name}"))
    db.upgrade(url)
    return url


@contextlib.contextmanager
def external_ledger(prefix: str, revision: str = "head"):
    """The URL of a new database on the machine's PostgreSQL (STREAMRL_TEST_EXTERNAL_DATABASE_URL,
    which CI sets), migrated to `revision`, dropped afterwards."""
    from urllib.parse import urlsplit, urlunsplit

    owner = db.psycopg_url(os.environ["STREAMRL_TEST_EXTERNAL_DATABASE_URL"])
    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    with db.connect(owner, autocommit=True) as conn:
        conn.execute(f'create database "{name}"')
    url = urlunsplit(urlsplit(owner)._replace(path=f"/{name}"))
    db.upgrade(url, revision)
    try:
        yield url
    finally:
        with db.connect(owner, autocommit=True) as conn:
            conn.execute(f'drop database "{name}" with (force)')


def start_serve_training(
    *args: str, port: int, timeout: float = 300, env: dict | None = None, log: Path | None = None
) -> subprocess.Popen:
    """`streamrl serve-training ARGS --port PORT --device cpu`, once it answers /healthz
    (a service restores the open sessions of its ledger first, hence the wait). Its
    output goes to `log` when given: a file, never a pipe the test does not read (a full
    pipe blocks the service in its next write)."""
    import httpx

    with open(log or os.devnull, "ab") as output:  # the child holds its own descriptor
        process = subprocess.Popen(
            [sys.executable, "-m", "streamrl.cli", "serve-training", *args, "--port", str(port), "--device", "cpu"],
            cwd=REPO,
            stdout=output,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
        )
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/api/v1/healthz", timeout=1).status_code == 200:
                return process
        except httpx.HTTPError:
            time.sleep(0.3)
    process.kill()
    raise AssertionError(f"serve-training did not answer within {timeout:.0f} s")


def wait_for(predicate, timeout: float, interval: float = 0.25, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def wait_for_first_step(ledger, run_id: str, run: subprocess.Popen, timeout: float = 300) -> None:
    """Until the run's first step is in the ledger, or its `streamrl run` has exited."""
    query = "select count(*) from train_steps where run_id = %s"
    wait_for(
        lambda: run.poll() is not None or ledger.execute(query, (run_id,)).fetchone()[0] >= 1,
        timeout=timeout,
        what="the first trained step",
    )


class SinkThread:
    """The ledger sink in a background thread of the test process."""

    def __init__(self, settings, run_id, **kwargs):
        from streamrl.consumers.ledger_sink import LedgerSink

        self.sink = LedgerSink(settings, run_id=run_id, **kwargs)
        self.thread = threading.Thread(target=self.sink.run, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self.sink

    def __exit__(self, *exc):
        self.sink.stop_requested.set()
        self.thread.join(30)
        self.sink.close()


def command_lines() -> dict[int, list[str]]:
    """pid -> argv of every process (psutil: `ps` cuts its output to the terminal width,
    which hides the arguments of long command lines). A child that `streamrl run` forked
    shows its command line as one title (setproctitle), split here into its words."""
    import psutil

    return {
        process.info["pid"]: " ".join(process.info["cmdline"]).split()
        for process in psutil.process_iter(["pid", "cmdline"])
        if process.info["cmdline"]
    }


def process_of(run_id: str, role: str) -> int | None:
    """The pid of the run's process with this role (`worker-0`: the worker named so, or of shard 0/N)."""
    command, _, shard = role.partition("-")
    command = {"publisher": "publish"}.get(command, command)
    for pid, args in command_lines().items():
        if "streamrl.cli" in args and run_id in " ".join(args) and command in args and "run" not in args[3:4]:
            if not shard or f"{shard}/" in " ".join(args) or role in args:  # --shard I/N, or --name worker-I
                return pid
    return None


# Tests that need a service (the embedded broker, PostgreSQL, an SGLang server, a
# browser): those using the session's services, and the modules that start their own.
SERVICE_FIXTURES = {"stack", "ledger", "external_database"}
SERVICE_MODULES = {
    "test_services",
    "test_sglang",
    "test_inference_servers",
    "test_supervision",
    "test_training_service",
    "test_observability",
    "test_demo",
    "test_sql_cli",
    "test_wheel",
    "test_scaffold",
    "test_fault_matrix",
    "test_group_wedge",
    "test_learner_parallel",
    "test_quiet_logs",
    "test_weight_broadcast",
    "test_sglang_adapters",
    "test_adversarial_readers",
    "test_migrations",
}


# The modules of 40 s or more, the longest first (their test-seconds in a CI
# rehearsal: docs/benchmarks.md). `make test`'s two pytest-xdist workers take whole
# modules in this order (--no-loadscope-reorder keeps it), so the last to start are
# short ones: a long module started last runs alone while the other worker idles.
LONGEST_MODULES = (
    "test_cluster",
    "test_rl_loop",
    "test_sglang",
    "test_replay",
    "test_training_service",
    "test_gsm8k_recipe",
    "test_topic_retention",
    "test_observability",
    "test_sglang_adapters",
    "test_shipped_tokenizers",
    "test_worker_group",
    "test_weight_broadcast",
    "test_fault_matrix",
    "test_byo",
    "test_seed_examples",
    "test_agent_recipe",
    "test_wheel",
    "test_learner_parallel",
    "test_service_limits",
    "test_cluster_twin",
    "test_ledger_sink",
    "test_lora",
    "test_tinker_cookbook",
    "test_group_wedge",
    "test_reference_loop",
    "test_adversarial_service",
    "test_recipe",
    "test_resume_after_broker_restart",
    "test_failure_budget",
    "test_shift_recipe",
    "test_bus_trust",
    "test_sql_cli",
)


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def module_name(item) -> str:
    return item.module.__name__.split(".")[-1]


def pytest_collection_modifyitems(config, items):
    cuda = cuda_available()
    for item in items:
        if SERVICE_FIXTURES & set(item.fixturenames) or module_name(item) in SERVICE_MODULES:
            item.add_marker(pytest.mark.services)
        if module_name(item) in LONGEST_MODULES:
            item.add_marker(pytest.mark.slow)
        if item.get_closest_marker("gpu") and not cuda:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA device"))
    rank = {name: i for i, name in enumerate(LONGEST_MODULES)}
    items.sort(key=lambda item: rank.get(module_name(item), len(rank)))  # stable: file order otherwise


@pytest.fixture(scope="module")
def sglang_python() -> Path:
    """The SGLang environment's python (`make sglang-env`); without one the test is
    skipped with that sentence, except under CI, where it fails."""
    python = Settings.from_env().sglang_python
    return required_environment(
        python, f"no SGLang environment at {python}: `make sglang-env` builds it (or set STREAMRL_SGLANG_PYTHON)"
    )


def required_environment(python: Path, missing: str) -> Path:
    """`python` of a separate environment a test needs; without it the test is skipped
    with the sentence `missing`, except under CI, where it fails."""
    if not python.exists():
        if os.environ.get("CI"):
            pytest.fail(missing)
        pytest.skip(missing)
    return python


# The built-in arith model and a managed SGLang server of it (CPU engine), one per module
# that asks (tests/test_sglang.py, test_weight_broadcast.py, ...).
@pytest.fixture(scope="module")
def model_dir() -> Path:
    return Path(prepare_recipe(REPO / "recipes" / "arith" / "recipe.yaml").rollout_worker.model_path)


@pytest.fixture(scope="module")
def server(sglang_python, model_dir, tmp_path_factory):
    managed = ManagedServer(sglang_python, str(model_dir), "cpu", {}, tmp_path_factory.mktemp("sglang") / "server.log")
    managed.start()
    yield managed
    managed.stop()


@pytest.fixture(scope="module")
def tinker_clients():
    """Makes the official Tinker ServiceClients a module's tests use, and closes their
    sessions before the module's training service stops (ask for this fixture after the
    service): an open session's heartbeat thread outlives the service and prints its
    failure every 10 s for the rest of the suite."""
    import tinker

    made = []

    def make(base_url: str, api_key: str):
        made.append(tinker.ServiceClient(base_url=base_url, api_key=api_key))
        return made[-1]

    yield make
    for client in made:
        try:
            client.close("success").result(timeout=60)
        except Exception as exc:  # a session the service forgot (restarted) still stops its heartbeat
            warnings.warn(f"closing a Tinker session: {exc!r}", stacklevel=1)
