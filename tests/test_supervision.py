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


def test_a_killed_supervisor_takes_its_children_with_it(stack, tmp_path):
    """`streamrl run` SIGKILLed (the OOM killer, a timeout) leaves no process of its run
    behind: each child, in a session of its own, is sent SIGTERM when its parent dies."""
    script = (
        f"import sys, time; from pathlib import Path; from streamrl.supervise import Supervisor, RestartPolicy\n"
        f"s = Supervisor(Path({str(tmp_path)!r}), dict(__import__('os').environ), RestartPolicy(), print)\n"
        f"c = s.spawn('sleeper', ['sql', 'select pg_sleep(120)']); print(c.process.pid, flush=True)\n"
        f"time.sleep(300)"
    )
    parent = subprocess.Popen([sys.executable, "-c", script], cwd=REPO, env=child_env(stack), stdout=subprocess.PIPE, text=True)
    child = psutil.Process(int(parent.stdout.readline()))
    wait_for(lambda: "sql" in " ".join(child.cmdline()), timeout=30, what="the child to start")
    parent.kill()
    parent.wait(timeout=10)
    wait_for(
        lambda: not child.is_running() or child.status() == psutil.STATUS_ZOMBIE, timeout=30, what="the orphaned child to end"
    )


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
    processor = subprocess.Popen(
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
