"""How the faust stream processor ends. faust reconnects to a lost broker forever, and a
faust worker leaves by SystemExit whatever happened, exit code 0 included when its
consumer died with the broker. StreamRL's rules: a broker away for STREAMRL_SERVICE_WAIT_S
is one sentence and exit 3 (runtime/outage.py), and only SIGTERM/SIGINT is a clean end.

`WorkerEnding` holds the broker watch (a plain reader of the run's small `runs` topic,
on a thread of its own) and decides, once the worker has stopped, what the stop was."""

from __future__ import annotations

import threading
import time

from streamrl.runtime.bus import IDLE_FETCH_WAIT_MS, RunReader
from streamrl.runtime.settings import Settings

ANSWER_GRACE_S = 2.0  # a broker answer this long after the stop shows the broker was not the cause


class WorkerEnding:
    def __init__(self, settings: Settings, run_id: str):
        self.settings, self.run_id = settings, run_id
        self.lost: list[BaseException] = []  # why the worker was stopped from outside: ServiceLost, RecoveryStalled
        self.broker_answered_at = 0.0  # monotonic time the watch last found the broker well
        self._stop = threading.Event()
        self.watch: threading.Thread | None = None

    def start_watch(self, worker) -> None:
        self.watch = threading.Thread(target=self._watch_broker, args=(worker,), name="broker-watch", daemon=True)
        self.watch.start()

    def stop_watch(self) -> None:
        self._stop.set()

    def _watch_broker(self, worker) -> None:
        try:
            reader = RunReader(
                self.settings, self.run_id, ["runs"], group_id=None, stage="processor", fetch_max_wait_ms=IDLE_FETCH_WAIT_MS
            )
        except Exception as exc:  # the broker went before the watch started
            self._stop_for(exc, worker)
            return
        try:
            while not self._stop.is_set():
                reader.poll(timeout_ms=1000)
                if reader.broker_watch.problem_since is None:
                    self.broker_answered_at = time.monotonic()
        except Exception as exc:  # ServiceLost, or the reader's own failure
            self._stop_for(exc, worker)
        finally:
            reader.close()

    def _stop_for(self, lost: BaseException, worker) -> None:
        self.lost.append(lost)
        if not worker.loop.is_closed():  # the worker may have stopped on its own already
            worker.loop.call_soon_threadsafe(lambda: worker.loop.create_task(worker.stop()))

    def _raise_if_the_broker_was_lost(self, worker, cause: BaseException | None = None) -> None:
        """When nothing asked the worker to stop, give the broker watch its time to say
        whether the broker is the cause (until it finds the broker well after the stop, or
        reports it lost, or STREAMRL_SERVICE_WAIT_S + 5 s pass); raise what it found."""
        stopped_at = time.monotonic()
        deadline = stopped_at + self.settings.service_wait_s + 5
        while (
            not asked_to_stop(worker)
            and not self.lost
            and self.watch is not None
            and self.watch.is_alive()
            and time.monotonic() < deadline
            and self.broker_answered_at < stopped_at + ANSWER_GRACE_S
        ):
            time.sleep(0.2)
        if self.lost:
            raise self.lost[0] from cause

    def raise_unless_asked_to_stop(self, worker, app, exit_code) -> None:
        """After the worker's SystemExit: nothing when SIGTERM/SIGINT asked for it;
        otherwise why it stopped (the lost broker, a crash) or that nobody asked."""
        self._raise_if_the_broker_was_lost(worker)
        crash = worker.crash_reason or app.crash_reason
        if crash is not None:
            raise RuntimeError(f"the stream processor's faust worker crashed: {crash!r}") from crash
        if exit_code not in (None, 0) or not asked_to_stop(worker):
            raise RuntimeError(f"the stream processor's faust worker stopped without being asked to (exit code {exit_code})")

    def raise_if_the_broker_was_lost(self, worker, crash: BaseException) -> None:
        """After a crash mode re-raised: the lost broker, when it was the cause."""
        self._raise_if_the_broker_was_lost(worker, crash)


def asked_to_stop(worker) -> bool:
    """Whether SIGTERM/SIGINT stopped the mode worker (its handlers schedule the stop)."""
    return worker._signal_stop_future is not None
