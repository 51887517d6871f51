"""Only a run's own processes can write what the run trusts: every frame on the bus is
signed with the run's key (schema/signing.py), and every reader checks the signature
before it decodes. A process that reaches the broker without the key (or with another
machine's) cannot get an event accepted: its forged weight version and run-status event
become dead letters, the run trains on its learner's versions only, and finishes."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import secrets
import signal
import subprocess
import sys

import pytest
from kafka import KafkaProducer

from streamrl.runtime.bus import EventPublisher
from streamrl.schema import codec, signing
from streamrl.schema.events import RunEvent, WeightVersion
from streamrl.schema.topics import topic_name
from tests.cli_zygote import cli_popen
from tests.conftest import REPO, process_of, wait_for

RECIPE = str(REPO / "recipes" / "arith" / "recipe.yaml")
STEPS = 6
ENV = {"ARITH_STEPS": str(STEPS), "ARITH_WARMUP_STEPS": "30", "ARITH_BATCH_PROMPTS": "8", "ARITH_SYNC_MODE": "sync"}


def test_a_frame_verifies_only_under_its_runs_key_and_unchanged():
    key = secrets.token_bytes(32)
    frame = codec.encode(WeightVersion(run_id="r1", version=3, uri="/w/v3"))
    value = signing.sign(signing.run_key(key, "r1"), frame)
    assert signing.verified(signing.run_key(key, "r1"), value, "r1") == frame
    for wrong_key, run in ((signing.run_key(key, "r2"), "r2"), (signing.run_key(secrets.token_bytes(32), "r1"), "r1")):
        with pytest.raises(codec.CodecError, match="signature does not verify"):
            signing.verified(wrong_key, value, run)
    tampered = value[:-1] + bytes([value[-1] ^ 1])
    with pytest.raises(codec.CodecError, match="signature does not verify"):
        signing.verified(signing.run_key(key, "r1"), tampered, "r1")
    with pytest.raises(codec.CodecError, match=r"unsigned frame \(0x01\)"):
        signing.verified(signing.run_key(key, "r1"), frame, "r1")


@pytest.mark.services
def test_forged_weight_versions_and_run_events_are_dead_letters_and_the_run_trains_on_its_own(stack, ledger, run_id, tmp_path):
    run = cli_popen(
        [sys.executable, "-m", "streamrl.cli", "run", RECIPE, "--run", run_id, "--out", str(tmp_path / "out")],
        cwd=REPO,
        env={**os.environ, **ENV},
        stdout=open(tmp_path / "run.log", "wb"),
        stderr=subprocess.STDOUT,
    )
    try:
        # The learner is held (SIGSTOP) from its first trained version until every forgery
        # is out, so that none of its versions lands among them on the partition (the run
        # id's) that readers follow in order. Its progress is read from its own folders:
        # the ledger can lag it by the whole run when the machine is busy.
        weights = stack.home / "weights" / run_id  # the recipe's weight.sync_weight_path
        wait_for(lambda: run.poll() is not None or process_of(run_id, "learner"), timeout=300, what="the run's learner")
        learner = process_of(run_id, "learner")
        assert learner is not None, "no learner process: " + (tmp_path / "run.log").read_text()[-3000:]
        wait_for(
            lambda: run.poll() is not None or (weights / "v000001").is_dir(),
            timeout=300,
            interval=0.02,
            what="the learner's first trained version",
        )
        assert run.poll() is None, (tmp_path / "run.log").read_text()[-3000:]
        os.kill(learner, signal.SIGSTOP)
        try:
            foreign = tmp_path / "foreign-weights"
            foreign.mkdir()
            forged = [
                WeightVersion(run_id=run_id, version=999_999, step=3, uri=str(foreign)),
                RunEvent(run_id=run_id, kind="finished", name="learner", message="forged"),
                RunEvent(run_id=run_id, kind="created", name="renamed", config={"forged": True}, sequence=7),
            ]
            # another machine's key: signed, but not with this run's
            other = dataclasses.replace(stack)
            other.__dict__["bus_key"] = secrets.token_bytes(32)
            with EventPublisher(other) as publisher:
                for event in forged:
                    publisher.publish(event)
            # no key at all: plain frames, as any client of the broker can write
            producer = KafkaProducer(bootstrap_servers=stack.kafka_bootstrap)
            for event in forged:
                producer.send(topic_name(run_id, event.KIND), value=codec.encode(event))
            producer.flush()
            producer.close()
            # With the run's key: what only another stage, or nobody, would say. The forged
            # version is two past the newest folder the learner has written: out of its
            # sequence whether or not that folder's version was published.
            folders = [folder.name for folder in weights.iterdir()]
            written = max(int(name[1:]) for name in folders if re.fullmatch(r"v\d{6}", name))
            forged_version = written + 2
            assert forged_version <= STEPS, f"the learner had written version {written} before it was held"
            held = [
                WeightVersion(run_id=run_id, version=999_999, step=3, uri=str(foreign), sha256="0" * 64),
                WeightVersion(
                    run_id=run_id,
                    version=forged_version,
                    step=forged_version,
                    uri=str(weights / f"v{forged_version:06d}"),
                    sha256="0" * 64,
                ),
                RunEvent(run_id=run_id, kind="created", name="renamed", config={"forged": True}),  # the created event's id
            ]
            with EventPublisher(stack) as publisher:
                refused_at = [publisher.publish(event).get(30) for event in held]
        finally:
            with contextlib.suppress(ProcessLookupError):  # it may have failed meanwhile: the run says why
                os.kill(learner, signal.SIGCONT)
        code = run.wait(timeout=600)
    finally:
        if run.poll() is None:
            run.kill()
    said = (tmp_path / "run.log").read_text(errors="replace")
    assert code == 0, said[-3000:]
    versions = [v for (v,) in ledger.execute("select version from weight_versions where run_id = %s order by 1", (run_id,))]
    assert versions == list(range(STEPS + 1))
    sampled_by = {v for (v,) in ledger.execute("select distinct weight_version from trajectories where run_id = %s", (run_id,))}
    assert sampled_by <= set(range(STEPS + 1))
    status, name, config = ledger.execute("select status, name, config from runs where run_id = %s", (run_id,)).fetchone()
    assert status == "finished" and name != "renamed" and "forged" not in config
    assert not ledger.execute("select 1 from run_events where run_id = %s and message = 'forged'", (run_id,)).fetchall()
    letters = ledger.execute(
        "select source_topic, error from dead_letters where run_id = %s order by source_topic, error", (run_id,)
    ).fetchall()
    unsigned = [e for _, e in letters if e.startswith("unsigned frame (0x01)")]
    wrong_key = [e for _, e in letters if e.startswith("signature does not verify")]
    assert len(unsigned) == len(wrong_key) == len(forged), letters
    assert {t for t, _ in letters} == {topic_name(run_id, "weights"), topic_name(run_id, "runs")}
    # the run's own key does not make a version out of its learner's sequence or folder,
    # nor a second `created` with other content, acceptable: each is a dead letter
    refused = {
        (topic, offset): error
        for topic, offset, error in ledger.execute(
            "select source_topic, source_offset, error from dead_letters where run_id = %s and error like 'refused: %%'",
            (run_id,),
        )
    }
    out_of_range, out_of_sequence, renamed = (refused.get((r.topic, r.offset), "") for r in refused_at)
    assert "outside 0..6" in out_of_range, refused
    assert "out of sequence" in out_of_sequence, refused
    assert "repeats an event id the ledger holds, with other content" in renamed, refused
    # the learner's own version of that number came after the forgery, and is the one recorded
    learners_partition, learners_offset, learners_sha256 = ledger.execute(
        "select kafka_partition, kafka_offset, sha256 from weight_versions where run_id = %s and version = %s",
        (run_id, forged_version),
    ).fetchone()
    assert (learners_partition, learners_sha256 != "0" * 64) == (refused_at[1].partition, True)
    assert learners_offset > refused_at[1].offset
