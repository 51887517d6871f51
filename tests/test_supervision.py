"""Supervision and lost services, as an operator meets them: `streamrl run`'s supervisor
restarts a crashing process with backoff and gives up after N crashes in its window
(never retrying bad usage); a process whose broker goes away waits, then ends with one
sentence naming the broker and the commands that bring the run back (the traceback
only with --debug)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from streamrl.orchestrate import child_env
from streamrl.producers.publisher import create_run
from streamrl.runtime import services
from streamrl.runtime.bus import EventPublisher
from streamrl.runtime.config import Recipe
from streamrl.runtime.settings import Settings
from streamrl.supervise import RestartPolicy, RunFailed, Supervisor
from tests.cli_zygote import cli_popen
from tests.conftest import REPO, free_port, read_until, wait_for


def supervise(stack, tmp_path, policy: RestartPolicy, args: list[str], timeout_s: float = 60):
    said = []
    supervisor = Supervisor(tmp_path, child_env(stack), policy, said.append)
    child = supervisor.spawn("crasher", args)
    deadline = time.monotonic() + timeout_s
    try:
        with pytest.raises(RunFailed) as failure:
            while time.monotonic() < deadline:
                supervisor.check()
                time.sleep(0.05)
    finally:
        supervisor.stop()
    return str(failure.value), said, child


def test_a_crashing_process_is_restarted_with_backoff_then_given_up(stack, tmp_path):
    # a query that fails: the command exits 1, as a crash does
    message, said, child = supervise(
        stack, tmp_path, RestartPolicy(max_restarts=2, window_s=60, backoff_s=0.2), ["sql", "select 1/0"]
    )
    assert "crasher crashed 3 times within 60 s (at most 2 restarts allowed): giving up" in message
    assert "division by zero" in message  # the child's last log lines come with it
    assert child.restarts == 2
    assert [line.split(";")[0] for line in said] == ["crasher exited with code 1"] * 2
    assert "restarting it in 0.2 s" in said[0] and "crash 2 of at most 3" in said[1]  # 0.2 s, then 0.4 s
    assert child.log_path.read_text().count("--- restarted by streamrl run") == 2


def test_bad_usage_is_not_retried(stack, tmp_path):
    message, said, child = supervise(stack, tmp_path, RestartPolicy(max_restarts=5), ["sql"])
    assert message.startswith("crasher exited with code 2") and said == [] and child.restarts == 0


def test_an_optional_process_that_keeps_crashing_is_left_stopped_and_the_run_goes_on(stack, tmp_path):
    """The trackers' feed: where a needed process would end the run, it is given up alone."""
    said = []
    supervisor = Supervisor(tmp_path, child_env(stack), RestartPolicy(max_restarts=1, window_s=60, backoff_s=0.1), said.append)
    tracker = supervisor.spawn("tracker", ["sql", "select 1/0"], optional="export back-fills it")
    needed = supervisor.spawn("needed", ["sql", "select pg_sleep(30)"])
    try:
        deadline = time.monotonic() + 60
        while not tracker.given_up and time.monotonic() < deadline:
            supervisor.check()  # never raises RunFailed for the optional child
            time.sleep(0.05)
        assert tracker.given_up and tracker.restarts == 1
        assert said[-1].startswith(
            "tracker is stopped and the run goes on without it: export back-fills it; tracker crashed 2 times within 60 s"
        )
        supervisor.check()
        assert needed.process.poll() is None and len(said) == 2  # said once; the needed child untouched
    finally:
        supervisor.stop()


def supervisor_script(tmp_path: Path, forked: bool, body: str) -> str:
    """A program that makes Supervisor `s` (its children forked from it, as `streamrl
    run`'s are, or new interpreters) and runs `body`."""
    return (
        "import os, sys, time; from pathlib import Path\n"
        "import functools, typer; from streamrl.cli import app; from streamrl.cli.common import forked_main\n"
        "from streamrl.supervise import Supervisor, RestartPolicy\n"
        f"s = Supervisor(Path({str(tmp_path)!r}), dict(os.environ), RestartPolicy(max_restarts=1, backoff_s=0.1), print, "
        f"fork_entry={'functools.partial(forked_main, typer.main.get_command(app))' if forked else 'None'})\n" + body
    )


@pytest.mark.parametrize("forked", [False, True], ids=["new-interpreter", "forked"])
def test_a_killed_supervisor_takes_its_children_with_it(stack, tmp_path, forked):
    """`streamrl run` SIGKILLed (the OOM killer, a timeout) leaves no process of its run
    behind: each child, in a session of its own, is sent SIGTERM when its parent dies."""
    script = supervisor_script(
        tmp_path,
        forked,
        "c = s.spawn('sleeper', ['sql', 'select pg_sleep(120)']); print(c.process.pid, flush=True)\ntime.sleep(300)",
    )
    parent = subprocess.Popen([sys.executable, "-c", script], cwd=REPO, env=child_env(stack), stdout=subprocess.PIPE, text=True)
    child = psutil.Process(int(parent.stdout.readline()))
    wait_for(lambda: "sql" in " ".join(child.cmdline()), timeout=30, what="the child to start")
    parent.kill()
    parent.wait(timeout=10)
    wait_for(
        lambda: not child.is_running() or child.status() == psutil.STATUS_ZOMBIE, timeout=30, what="the orphaned child to end"
    )


def test_a_forked_child_is_the_command_it_runs(stack, tmp_path):
    """A child forked from `streamrl run` (it starts with its parent's imports) is what a
    new `python -m streamrl.cli ARGS` would be: its command line in `ps`, a session of its
    own, its output in its log, its exit code seen by the supervisor (a crash restarted,
    as a new interpreter once the supervisor runs threads), and SIGTERM stops it."""
    body = (
        "import threading, psutil\n"
        "from streamrl.supervise import ForkedProcess\n"
        "sleeper = s.spawn('sleeper', ['sql', 'select pg_sleep(120)'])\n"
        "me = psutil.Process(sleeper.process.pid)\n"
        "while ' '.join(me.cmdline()).split()[1:2] != ['-m']: time.sleep(0.05)  # until it has its title\n"
        "print('title', ' '.join(me.cmdline()).split()[1:], flush=True)\n"
        "print('forked', isinstance(sleeper.process, ForkedProcess), os.getsid(me.pid) != os.getsid(0), flush=True)\n"
        "ok = s.spawn('ok', ['sql', 'select 40 + 2 as answer'], may_finish=True)\n"
        "print('ok exit', ok.process.wait(60), flush=True)\n"
        "threading.Thread(target=time.sleep, args=(300,), daemon=True).start()\n"
        "crasher = s.spawn('crasher', ['sql', 'select 1/0'])\n"
        "print('crasher exit', crasher.process.wait(60), flush=True)\n"
        "try:\n"
        "    while True: s.check(); time.sleep(0.05)\n"
        "except Exception as exc: print('gave up:', str(exc).splitlines()[0], flush=True)\n"
        "print('restarted new', not isinstance(crasher.process, ForkedProcess), crasher.restarts, flush=True)\n"
        "s.stop(timeout_s=30)\n"
        "print('sleeper exit', sleeper.process.poll(), flush=True)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", supervisor_script(tmp_path, True, body)],
        cwd=REPO,
        env=child_env(stack),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    said = result.stdout
    assert "title ['-m', 'streamrl.cli', 'sql', 'select', 'pg_sleep(120)']" in said
    assert "forked True True" in said  # forked, in a session of its own
    assert "ok exit 0" in said and "42" in (tmp_path / "ok.log").read_text()
    assert "crasher exit 1" in said and "division by zero" in (tmp_path / "crasher.log").read_text()
    assert "gave up: crasher crashed 2 times" in said
    assert "restarted new True 1" in said  # the supervisor had a thread by then
    assert "sleeper exit -15" in said  # SIGTERM, as the supervisor sends it


@pytest.fixture
def own_broker(monkeypatch):
    """A broker of this test's own, which it stops."""
    home = Path(tempfile.mkdtemp(prefix="streamrl-broker-"))
    monkeypatch.setenv("STREAMRL_HOME", str(home))
    monkeypatch.setenv("STREAMRL_KAFKA_PORT", str(free_port()))
    state = services.start_embedded_kafka(Settings.from_env())
    monkeypatch.setenv("STREAMRL_KAFKA_BOOTSTRAP", state["bootstrap"])
    yield Settings.from_env(), state
    services.stop_embedded_kafka(state)


@pytest.mark.parametrize("debug", [False, True])
def test_a_lost_broker_ends_a_process_with_one_sentence(own_broker, run_id, debug):
    settings, state = own_broker
    with EventPublisher(settings) as publisher:
        create_run(settings, run_id, Recipe(), publisher)
    env = {**os.environ, "STREAMRL_SERVICE_WAIT_S": "3"}
    processor = cli_popen(
        [sys.executable, "-m", "streamrl.cli", *(["--debug"] if debug else []), "processor", run_id],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    # the broker goes while it reads, not while it starts: it says when it is reading
    said = read_until(processor, "processor running", timeout=180)
    assert "processor running" in said and processor.poll() is None, said + processor.communicate()[1]
    os.kill(state["pid"], signal.SIGKILL)
    _out, err = processor.communicate(timeout=60)
    assert processor.returncode == 3
    sentence = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(sentence) == 1, err
    assert f"the Kafka broker at {state['bootstrap']} did not answer for" in " ".join(err.split())
    assert f"`streamrl run --resume {run_id}`" in " ".join(err.split())
    assert ("Traceback" in err) is debug


# What kafka-python 3.0 logged in a worker's log (docs/decisions.md "Kafka clients' tracebacks").
CLIENT_ERROR = """
import logging
from streamrl.cli import app
app(["recipe", "validate", "recipes/arith/recipe.yaml"], standalone_mode=False)
logging.basicConfig(format="%(name)s: %(message)s")
try:
    None.recv(4096)
except AttributeError:
    logging.getLogger("kafka.net.transport").exception("<KafkaTCPTransport>: Error receiving network data closing socket")
    logging.getLogger("streamrl.worker").exception("a failure of StreamRL's own")
    logging.getLogger("kafka.conn").exception("%s and %s", "one argument of two")  # reported, never raised
"""


@pytest.mark.parametrize("debug", [False, True])
def test_a_kafka_clients_handled_error_is_one_line_and_debug_keeps_its_traceback(debug):
    env = {**os.environ, "STREAMRL_DEBUG": "1"} if debug else {k: v for k, v in os.environ.items() if k != "STREAMRL_DEBUG"}
    result = subprocess.run([sys.executable, "-c", CLIENT_ERROR], cwd=REPO, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    client, own = result.stderr.split("streamrl.worker: ")
    one_line = "Error receiving network data closing socket (AttributeError: 'NoneType' object has no attribute 'recv')"
    assert ("Traceback" in client) is debug, client
    assert (one_line in client) is not debug, client
    assert "Traceback" in own  # StreamRL's own errors are not the clients'
