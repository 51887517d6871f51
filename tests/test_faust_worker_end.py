"""How the faust stream processor ends (consumers/faust_ending.py): a faust worker
leaves by SystemExit whatever happened, exit code 0 included when its consumer died
with the broker, so only a stop asked for by SIGTERM/SIGINT may end the process cleanly.
Checked on the decision itself, with the worker's and broker watch's states set by hand."""

from __future__ import annotations

import dataclasses
import threading
import time
from types import SimpleNamespace

import pytest

from streamrl.consumers.faust_ending import WorkerEnding
from streamrl.runtime.outage import ServiceLost
from streamrl.runtime.settings import Settings


def ending(lost=(), answered_at=0.0):
    """The decision with a watch that runs until the test ends and the broker states set by hand."""
    decision = WorkerEnding(dataclasses.replace(Settings.from_env(), service_wait_s=2), "a-run")
    decision.lost, decision.broker_answered_at = list(lost), answered_at
    decision.watch = threading.Thread(target=decision._stop.wait, daemon=True)
    decision.watch.start()
    return decision


def app(crash=None):
    return SimpleNamespace(crash_reason=crash)


def worker(asked_to_stop: bool, crash=None):
    return SimpleNamespace(_signal_stop_future=object() if asked_to_stop else None, crash_reason=crash)


def test_sigterm_is_a_clean_end():
    decision = ending()
    decision.raise_unless_asked_to_stop(worker(asked_to_stop=True), app(), 0)
    decision.stop_watch()


def test_a_stop_nobody_asked_for_while_the_broker_answers_is_an_error():
    decision = ending()
    threading.Timer(0.5, lambda: setattr(decision, "broker_answered_at", time.monotonic() + 5)).start()
    started = time.monotonic()
    with pytest.raises(RuntimeError, match="stopped without being asked to"):
        decision.raise_unless_asked_to_stop(worker(asked_to_stop=False), app(), 0)
    assert time.monotonic() - started < 2  # the broker's answer ends the wait, not the 7 s deadline
    decision.stop_watch()


def test_a_stop_nobody_asked_for_waits_for_the_broker_watch_to_name_the_lost_broker():
    decision = ending()
    lost = ServiceLost("the Kafka broker at 127.0.0.1:1 did not answer for 2 s")
    threading.Timer(1.0, lambda: decision.lost.append(lost)).start()
    with pytest.raises(ServiceLost) as raised:
        decision.raise_unless_asked_to_stop(worker(asked_to_stop=False), app(), 0)
    assert raised.value is lost
    crash = ConnectionError("the consumer's fetch")  # a crash mode re-raised, the broker its cause
    already_lost = ending(lost=[lost])
    with pytest.raises(ServiceLost) as raised:
        already_lost.raise_if_the_broker_was_lost(worker(asked_to_stop=False), crash)
    assert raised.value.__cause__ is crash
    decision.stop_watch()
    already_lost.stop_watch()


def test_a_crashed_worker_or_app_is_an_error_naming_the_crash():
    worker_crashed, app_crashed, other_crash = ending(), ending(), ending(answered_at=time.monotonic() + 5)
    with pytest.raises(RuntimeError, match="crashed: ValueError"):
        worker_crashed.raise_unless_asked_to_stop(worker(asked_to_stop=True, crash=ValueError("agent")), app(), 0)
    with pytest.raises(RuntimeError, match="crashed: KeyError"):
        app_crashed.raise_unless_asked_to_stop(worker(asked_to_stop=True), app(KeyError("table")), 0)
    # a crash that is not the broker's is left to propagate as it is
    other_crash.raise_if_the_broker_was_lost(worker(asked_to_stop=False), ValueError())
    for decision in (worker_crashed, app_crashed, other_crash):
        decision.stop_watch()
