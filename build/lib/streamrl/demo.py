"""`streamrl demo`: a synthetic run through the whole backbone (its topics on the broker,
every event type, the ledger sink), then the ledger's count of what arrived."""

from __future__ import annotations

from rich.console import Console
from rich.progress import Progress

from streamrl.consumers.ledger_sink import LedgerSink
from streamrl.producers.synthetic import synthetic_events
from streamrl.runtime.bus import EventPublisher
from streamrl.runtime.settings import Settings
from streamrl.runtime.sql import QueryResult, run_readonly
from streamrl.runtime.topic_admin import create_run_topics
from streamrl.schema.events import RunEvent

LEDGER_TABLES = (
    "tasks",
    "trajectories",
    "evaluations",
    "samples",
    "train_steps",
    "weight_versions",
    "run_events",
    "dead_letters",
)


def run_demo(settings: Settings, database_url: str, run: str, rollouts: int, console: Console) -> QueryResult:
    create_run_topics(settings, run)
    total = rollouts * 8 + 1
    with Progress(console=console) as progress:
        published = progress.add_task("publish to Kafka", total=total)
        with EventPublisher(settings, stage="demo") as publisher:
            publisher.publish(RunEvent(run_id=run, kind="created", name=run, config={"demo": True}))
            for event in synthetic_events(run, rollouts):
                publisher.publish(event)
                progress.advance(published)
            progress.advance(published)
        written = progress.add_task("sink into the ledger", total=total)
        worker = LedgerSink(settings, run_id=run)
        try:
            while worker.stats.rows + worker.stats.dead_letters < total:
                worker.poll_once()
                progress.update(written, completed=worker.stats.rows + worker.stats.dead_letters)
        finally:
            worker.close()
    query = " union all ".join(
        f"select '{table}' as table_name, count(*) as rows from {table} where run_id = %(run)s" for table in LEDGER_TABLES
    )
    return run_readonly(database_url, query, {"run": run})
