"""How the faust stream processor ends (consumers/faust_processor.py): a faust worker
leaves by SystemExit whatever happened, exit code 0 included when its consumer died
with the broker, so only a stop asked for by SIGTERM/SIGINT may end the process cleanly.
Checked on the decision itself, with the worker's and broker watch's states set by hand."""

from __future__ import annotations

import dataclasses
import threading
import time
from types import SimpleNamespace

import pytest

from consumers.faust_processor import FaustProcessor
from runtime.outage import ServiceLost
from runtime.settings import Settings


def ending(lost=(), answered_at=0.0, app_crash=None):
    processor = FaustProcessor.__new__(FaustProcessor)  # the decision needs no app or broker
    processor.settings = dataclasses.replace(Settings.from_env(), service_wait_s=2)
    processor.lost, processor.broker_answered_at = list(lost), answered_at
    processor.app = SimpleNamespace(crash_reason=app_crash)
    return processor


def worker(asked_to_stop: bool, crash=None):
    return SimpleNamespace(_signal_stop_future=object() if asked_to_stop else None, crash_reason=crash)


def running_watch(stop: threading.Event) -> threading.Thread:
    watch = threading.Thread(target=stop.wait, daemon=True)
    watch.start()
    return watch


def test_sigterm_is_a_clean_end():
    stop = threading.Event()
    ending()._raise_unless_asked_to_stop(worker(asked_to_stop=True), running_watch(stop), 0)
    stop.set()


def test_a_stop_nobody_asked_for_while_the_broker_answers_is_an_error():
    stop = threading.Event()
    processor = ending()
    answering = threading.Timer(0.5, lambda: setattr(processor, "broker_answered_at", time.monotonic() + 5))
    answering.start()
    started = time.monotonic()
    with pytest.raises(RuntimeError, match="stopped without being asked to"):
        processor._raise_unless_asked_to_stop(worker(asked_to_stop=False), running_watch(stop), 0)
    assert time.monotonic() - started < 2  # the broker's answer ends the wait, not the 7 s deadline
    stop.set()


def test_a_stop_nobody_asked_for_waits_for_the_broker_watch_to_name_the_lost_broker():
    stop = threading.Event()
    processor = ending()
    lost = ServiceLost("the Kafka broker at 127.0.0.1:1 did not answer for 2 s")
    threading.Timer(1.0, lambda: processor.lost.append(lost)).start()
    with pytest.raises(ServiceLost) as raised:
        processor._raise_unless_asked_to_stop(worker(asked_to_stop=False), running_watch(stop), 0)
    assert raised.value is lost
    stop.set()


def test_a_crashed_worker_or_app_is_an_error_naming_the_crash():
    stop = threading.Event()
    watch = running_watch(stop)
    with pytest.raises(RuntimeError, match="crashed: ValueError"):
        ending(answered_at=time.monotonic() + 5)._raise_unless_asked_to_stop(
            worker(asked_to_stop=True, crash=ValueError("agent")), watch, 0)
    with pytest.raises(RuntimeError, match="crashed: KeyError"):
        ending(answered_at=time.monotonic() + 5, app_crash=KeyError("table"))._raise_unless_asked_to_stop(
            worker(asked_to_stop=True), watch, 0)
    stop.set()
