"""Library progress bars off inside StreamRL's processes, and the Kafka clients'
tracebacks of errors they handle themselves down to one line.

transformers and huggingface_hub draw a tqdm bar for every model load and save
("Loading weights", "Writing model shards"): a learner saves a weight version and a
worker loads one every step, so a run's logs filled with hundreds of bars. StreamRL
shows its own progress (`streamrl run`'s bars, the learner's step lines). Both libraries
read these variables when first imported, so this runs before they are; a user who sets
them keeps their choice.
"""

from __future__ import annotations

import logging
import os
from typing import Any


def quiet_library_progress() -> None:
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")


KAFKA_CLIENT_LOGGERS = ("kafka", "aiokafka")


def kafka_client_errors_in_one_line() -> None:
    """A Kafka client's log record with an exception keeps the exception as one line,
    `(Type: message)`, instead of a traceback: the clients log tracebacks of connection
    errors they handle themselves by reconnecting, which read as failures of the run
    (docs/decisions.md "Kafka clients' tracebacks"). A lost broker is still one sentence
    from StreamRL's own watch; `streamrl --debug` keeps the tracebacks. Applied where
    records are made, so it holds for every handler, the last-resort one included; a
    second call changes nothing."""
    make_record = logging.getLogRecordFactory()
    if getattr(make_record, "kafka_errors_in_one_line", False):
        return

    def one_line(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = make_record(*args, **kwargs)
        if record.exc_info and record.name.partition(".")[0] in KAFKA_CLIENT_LOGGERS:
            try:
                message = record.getMessage()
            except Exception:  # a malformed record: left whole, for logging to report when written
                return record
            error = record.exc_info[1]
            record.msg, record.args = f"{message} ({type(error).__name__}: {error})", None
            record.exc_info, record.exc_text, record.stack_info = None, None, None
        return record

    one_line.kafka_errors_in_one_line = True  # type: ignore[attr-defined]
    logging.setLogRecordFactory(one_line)
