"""A cluster learner's failure, recorded as the run's `failed` event."""

from __future__ import annotations

import logging
import os
import time

from streamrl.runtime.bus import EventPublisher
from streamrl.runtime.db import connect
from streamrl.runtime.settings import SUPERVISED, Settings
from streamrl.schema.events import RunEvent

log = logging.getLogger("streamrl.learner")


def record_failure(settings: Settings, run: str, step: int, exc: BaseException) -> None:
    """The run's `failed` event, from the learner's first rank, where no `streamrl run`
    supervises it (a cluster's learner): a learner that stops (a node lost, say) stops the
    run until it is started again, which records `resumed`. Best effort: the broker may
    be what failed."""
    if os.environ.get("RANK", "0") != "0" or os.environ.get(SUPERVISED):
        return
    try:  # numbered as `streamrl run` numbers its failed events: a resumed run may fail again
        with connect(settings.database_url, autocommit=True, connect_timeout=5) as conn:
            query = "select count(*) from run_events where run_id = %s and kind = 'failed'"
            sequence = (conn.execute(query, (run,)).fetchone() or (0,))[0]
    except Exception:  # no ledger either: a number no earlier failure of this run has
        sequence = int(time.time()) % 2**31
    first_line = (str(exc).strip().splitlines() or [""])[0]
    where = os.environ.get("STREAMRL_LEARNER_ADDR") or os.uname().nodename
    event = RunEvent(
        run_id=run,
        kind="failed",
        sequence=sequence,
        name="learner",
        message=f"the learner (rank 0 on {where}) failed after step {step}: {type(exc).__name__}: {first_line}",
        details={"step": step, "error": type(exc).__name__},
    )
    try:
        with EventPublisher(settings, stage="learner", max_block_ms=5000, request_timeout_ms=5000) as publisher:
            publisher.publish(event)
            publisher.flush(timeout=10)
    except Exception as error:  # the run's status stays as it was; the exception itself still says why
        log.warning("could not record the learner's failure on the bus: %s: %s", type(error).__name__, error)
