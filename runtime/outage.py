"""Lost services: waiting for the broker or PostgreSQL to come back, and the one
sentence a process ends with when they do not.

Every process of a run waits the same way: the Kafka client reconnects by itself (its
backoff grows to `reconnect_backoff_max_ms`), PostgreSQL connections are re-opened
with a delay that doubles up to 10 s, and after `STREAMRL_SERVICE_WAIT_S` without the
service the process raises `ServiceLost`, which the CLI prints as one sentence (exit
code 3) naming the service, its address, and the commands that bring the run back.
"""

from __future__ import annotations

import logging
import threading
import time

from streamrl.runtime.backoff import backoff_delay
from streamrl.runtime.services import redact
from streamrl.runtime.settings import Settings

log = logging.getLogger("streamrl.outage")


class ServiceLost(RuntimeError):
    pass


def how_to_recover(run_id: str | None) -> str:
    finish = f"`streamrl run --resume {run_id}`" if run_id else "the command that stopped"
    return f"bring it back (`streamrl up` for the embedded services), then {finish}"


def postgres_lost(settings: Settings, run_id: str | None, waited_s: float, detail: str) -> ServiceLost:
    return ServiceLost(
        f"PostgreSQL at {redact(settings.database_url)} did not answer for {waited_s:.0f} s "
        f"({detail.strip().splitlines()[0] if detail.strip() else 'no answer'}): "
        f"{how_to_recover(run_id)}."
    )


def broker_lost(settings: Settings, run_id: str | None, waited_s: float, detail: str) -> ServiceLost:
    return ServiceLost(f"the Kafka broker at {settings.kafka_bootstrap} {detail} for {waited_s:.0f} s: {how_to_recover(run_id)}.")


class PostgresOutage:
    """How long the ledger has been unreachable, and the wait before the next try."""

    def __init__(self, settings: Settings, run_id: str | None, stop: threading.Event | None = None):
        self.settings, self.run_id = settings, run_id
        self.stop = stop or threading.Event()
        self.since: float | None = None
        self.tries = 0

    def wait(self, exc: Exception) -> None:
        """After a failed use of the database: sleep before the next try, or raise ServiceLost."""
        now = time.monotonic()
        if self.since is None:
            self.since = now
            log.warning(
                "lost PostgreSQL (%s); retrying for up to %d s",
                str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__,
                self.settings.service_wait_s,
            )
        if now - self.since > self.settings.service_wait_s:
            raise postgres_lost(self.settings, self.run_id, now - self.since, str(exc)) from exc
        self.tries += 1
        self.stop.wait(backoff_delay(self.tries, 0.5, 10.0))

    def recovered(self) -> None:
        if self.since is not None:
            log.warning("PostgreSQL answers again after %.0f s", time.monotonic() - self.since)
        self.since, self.tries = None, 0


# A broker that answers without the run's topics, or with topics of the same names made
# again, has lost what they held: waiting does not bring it back. Confirmed for this long
# (a restarting broker may answer before its metadata is whole), then said.
TOPICS_LOST_CONFIRM_S = 5.0


def topics_lost(settings: Settings, run_id: str | None, problem: str) -> ServiceLost:
    finish = f"`streamrl run --resume {run_id}`" if run_id else "`streamrl run --resume RUN`"
    return ServiceLost(
        f"the Kafka broker at {settings.kafka_bootstrap} {problem}: it restarted without durable storage, so the events "
        f"it held are gone and the run cannot go on from it. Stop the run's processes and finish it with {finish}, "
        "which rebuilds the topics from the ledger (docs/operations.md)."
    )


class BrokerWatch:
    """Notices a consumer that has lost the broker (raises ServiceLost once that has lasted
    `STREAMRL_SERVICE_WAIT_S`), or whose topics the broker no longer has, or has made
    again (an embedded broker restarted: it keeps topics in memory; raised after
    TOPICS_LOST_CONFIRM_S). Checked at most once a second."""

    def __init__(self, settings: Settings, consumer, run_id: str | None, topics: list[str] | None = None, exist: bool = True):
        """`exist`: the topics exist now (a reader waited for them); otherwise each is
        watched from when it is first seen (the sink starts before its run is created)."""
        self.settings, self.consumer, self.run_id, self.topics = settings, consumer, run_id, topics or []
        self.problem_since: float | None = None
        self.warned = False
        self.last_check = 0.0
        self.seen: set[str] = set(self.topics) if exist else set()
        self.topic_ids: dict[str, object] = {}  # the id each topic had when first seen (Kafka's topic UUID)

    def problem(self) -> tuple[str, bool] | None:
        """What is wrong, and whether it is lost topics (final) rather than no answer."""
        metrics = self.consumer.metrics().get("consumer-metrics", {})
        if metrics.get("connection-count", 1) == 0:
            return "did not answer", False
        present = {t for t in self.topics if self.consumer.partitions_for_topic(t)}
        missing = sorted(self.seen - present)
        self.seen |= present
        if missing:
            return f"no longer has the run's topics ({', '.join(missing[:2])})", True
        remade = self.remade_topics()
        if remade:
            return f"made the run's topics again, empty ({', '.join(remade[:2])}: a new topic id)", True
        return None

    def remade_topics(self) -> list[str]:
        """The watched topics whose id differs from the one first seen."""
        cluster = getattr(getattr(self.consumer, "_client", None), "cluster", None)
        if cluster is None or not hasattr(cluster, "topic_id"):  # a client that keeps no topic ids
            return []
        remade = []
        for topic in sorted(self.seen):
            current = cluster.topic_id(topic)
            if current is not None and self.topic_ids.setdefault(topic, current) != current:
                remade.append(topic)
        return remade

    def check(self) -> None:
        now = time.monotonic()
        if now - self.last_check < 1.0:
            return
        self.last_check = now
        found = self.problem()
        if found is None:
            if self.problem_since is not None and self.warned:
                log.warning("the Kafka broker answers again after %.0f s", now - self.problem_since)
            self.problem_since = None
            return
        problem, final = found
        if self.problem_since is None:
            self.problem_since = now
            self.warned = False
        elif not self.warned and now - self.problem_since >= 5.0:  # a client reconnects now and then
            self.warned = True
            log.warning("the Kafka broker %s; waiting up to %d s", problem, self.settings.service_wait_s)
        if final and now - self.problem_since >= TOPICS_LOST_CONFIRM_S:
            raise topics_lost(self.settings, self.run_id, problem)
        if now - self.problem_since > self.settings.service_wait_s:
            raise broker_lost(self.settings, self.run_id, now - self.problem_since, problem)
