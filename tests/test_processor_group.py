"""The stream processor as a faust app in a consumer group: two `streamrl processor`
instances share a run's partitions; one is SIGKILLed mid-stream and restarted. Every
group ends in the ledger exactly once: samples for the groups that teach, a
`zero_variance` record for the others, none twice, none missing."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time

import msgspec

from streamrl.consumers.processor import PROCESSOR_GROUP
from streamrl.producers.publisher import create_run
from streamrl.runtime.bus import EventPublisher
from streamrl.runtime.config import Recipe
from streamrl.schema.topics import topic_name
from tests.cli_zygote import cli_popen
from tests.conftest import REPO, SinkThread, committed_offsets, count_rows, ledger_read_to, topic_ends, wait_for
from tests.test_processor import member

GROUPS = 160
SIZE = 4


def group_events(run_id: str, g: int) -> list:
    """Group g of SIZE members, trajectory then evaluation; every third group has equal
    rewards (filtered)."""
    rewards = [0.5] * SIZE if g % 3 == 0 else [float((g + i) % 2) for i in range(SIZE)]
    events = []
    for i, reward in enumerate(rewards):
        t, e = member(i, reward)
        tid = f"g{g}-{i}"
        events.append(
            msgspec.structs.replace(
                t, run_id=run_id, group_id=f"g{g}", trajectory_id=tid, task_id=tid, group_size=SIZE, step=1 + g // 40, event_id=""
            )
        )
        events.append(
            msgspec.structs.replace(e, run_id=run_id, group_id=f"g{g}", trajectory_id=tid, step=1 + g // 40, event_id="")
        )
    return events


def start_processor(run_id: str, name: str, log) -> subprocess.Popen:
    return cli_popen(
        [sys.executable, "-m", "streamrl.cli", "--debug", "processor", run_id, "--name", name],
        cwd=REPO,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def test_two_processors_one_killed_account_for_every_group_once(stack, ledger, run_id, tmp_path):
    recipe = Recipe()
    # the test counts groups, not timeouts: a slow rebalance on a loaded machine must not
    # turn an open group into a timed-out one
    recipe.trajectory_pool.group_timeout_s = 3600.0
    with EventPublisher(stack) as publisher:
        create_run(stack, run_id, recipe, publisher)
    log = open(tmp_path / "processors.log", "ab")
    processors = {name: start_processor(run_id, name, log) for name in ("p0", "p1")}
    sent = []
    try:
        with SinkThread(stack, run_id), EventPublisher(stack) as publisher:
            for first in range(0, GROUPS, 8):
                batch = [group_events(run_id, g) for g in range(first, first + 8)]
                # trajectories first, evaluations a little later: the groups stay open a while
                for half in (0, 1):
                    for events in batch:
                        for event in events[half::2]:
                            sent.append(publisher.publish(event))
                    publisher.flush()
                    time.sleep(0.3)
                    if first == GROUPS // 2 and half == 0:  # p0 dies holding open groups
                        wait_for(lambda: count_rows(ledger, "samples", run_id), 60, what="the first samples")
                        time.sleep(1.0)
                        processors["p0"].send_signal(signal.SIGKILL)
                        processors["p0"].wait()
                        processors["p0"] = start_processor(run_id, "p0", log)
            publisher.flush()
            inputs: dict[tuple[str, int], int] = {}  # the end of what was published, by partition
            for record in (future.get(60) for future in sent):
                key = (record.topic, record.partition)
                inputs[key] = max(inputs.get(key, 0), record.offset + 1)
            filtered_groups = sum(1 for g in range(GROUPS) if g % 3 == 0)
            expected_samples = (GROUPS - filtered_groups) * SIZE

            def restart_exited() -> None:
                """What `streamrl run` does for a processor that exits (a table recovery
                that stayed stuck ends the process: consumers/faust_recovery.py)."""
                for name, process in processors.items():
                    if process.poll() is not None:
                        print(f"{name} exited with {process.returncode}: restarted")
                        processors[name] = start_processor(run_id, name, log)

            def complete() -> bool:
                restart_exited()
                return (
                    count_rows(ledger, "samples", run_id) >= expected_samples
                    and count_rows(ledger, "filtered_groups", run_id) >= filtered_groups
                )

            wait_for(complete, 180, what="every group in the ledger")
            # A processor emits a group's records before it commits the inputs that made
            # them: once every input is committed, anything emitted twice is on the samples
            # topic, and once the sink has written that topic to its end, in the ledger.
            group = f"{PROCESSOR_GROUP}.{run_id}"

            def inputs_committed() -> bool:
                restart_exited()
                committed = committed_offsets(stack, group)
                return all(committed.get(key, -1) >= end for key, end in inputs.items())

            wait_for(inputs_committed, 120, what="the processors to commit every input")
            outputs = topic_ends(stack, topic_name(run_id, "samples"))
            wait_for(lambda: ledger_read_to(ledger, outputs), 120, what="the sink to write the samples topic to its end")
    finally:
        for process in processors.values():
            process.send_signal(signal.SIGKILL)
            process.wait()
        log.close()
        # shown with a failure: what the processors said, the lines that tell first (a CI
        # log keeps the start of a test's output), then the end of the whole log
        said = (tmp_path / "processors.log").read_text(errors="replace")
        telling = [line for line in said.splitlines() if re.search(r"ERROR|WARN|stall|exited|stopp|Traceback|Error", line)]
        print("\n".join(["the processors' errors, warnings and exits:", *telling[-60:], "the end of their log:"]))
        print(said[-20000:])
    assert count_rows(ledger, "samples", run_id) == expected_samples
    assert count_rows(ledger, "filtered_groups", run_id) == filtered_groups
    reasons = ledger.execute("select reason, count(*) from filtered_groups where run_id = %s group by 1", (run_id,)).fetchall()
    assert reasons == [("zero_variance", filtered_groups)]
    # every group accounted for: its members are samples, or its filtered record counts them
    accounted = ledger.execute(
        """
        select count(distinct group_id) from (
            select group_id from samples where run_id = %s
            union all select group_id from filtered_groups where run_id = %s) g""",
        (run_id, run_id),
    ).fetchone()[0]
    assert accounted == GROUPS
    per_group = ledger.execute(
        "select count(*) from samples where run_id = %s group by group_id having count(*) <> %s", (run_id, SIZE)
    ).fetchall()
    assert per_group == []
