"""What a reader checks of a weight version before it acts on it (runtime/weight_trust.py),
and what `window_steps: auto` becomes (runtime/service_config.py); values by hand."""

from __future__ import annotations

from pathlib import Path

import pytest

from streamrl.runtime.folders import directory_sha256
from streamrl.runtime.service_config import Broker, resolved_window_steps
from streamrl.runtime.weight_trust import (
    VersionRules,
    VersionSequence,
    WeightVersionRefused,
    check_folder,
    next_version,
)
from streamrl.schema.events import WeightBroadcast, WeightVersion

BROADCAST = WeightBroadcast(address="h", port=1, group_name="g", world_size=2, backend="gloo", names=[], dtypes=[], shapes=[])


def rules(tmp_path: Path, total_steps: int | None = 10, sync_every: int = 3, broadcast: bool = False) -> VersionRules:
    return VersionRules(tmp_path / "weights" / "r", tmp_path / "model", sync_every, total_steps, broadcast)


def version(tmp_path: Path, number: int, folder: Path | None = None, **fields) -> WeightVersion:
    folder = folder or tmp_path / "weights" / "r" / f"v{number:06d}"
    return WeightVersion(run_id="r", version=number, uri=str(folder), **({"sha256": "0" * 64} | fields))


def test_the_next_version_after_each_one_counts_sync_every_and_ends_at_the_last_step():
    # sync_every 3, 10 steps: versions 0, 3, 6, 9 and the last step, 10
    assert [next_version(v, 3, 10) for v in (0, 3, 6, 9, 10)] == [3, 6, 9, 10, None]
    assert next_version(4, 3, 10) == 6  # after a version announced again off the grid
    assert [next_version(v, 1, 3) for v in (0, 1, 2, 3)] == [1, 2, 3, None]


def test_a_version_the_learner_cannot_have_announced_is_refused_with_its_reason(tmp_path):
    check = rules(tmp_path)
    assert check.problem(version(tmp_path, 0)) is None
    assert check.problem(version(tmp_path, 0, tmp_path / "model")) is None  # the model folder, as it is
    assert check.problem(version(tmp_path, 6)) is None and check.problem(version(tmp_path, 10)) is None
    refused = {
        "outside 0..10": version(tmp_path, 999_999),
        "not one the learner publishes": version(tmp_path, 4),
        "not the run's folder": version(tmp_path, 3, tmp_path / "foreign"),
        "not the run's folder for it": version(tmp_path, 6, tmp_path / "weights" / "r" / "v000003"),
        "no sha256": version(tmp_path, 3, sha256=""),
        "a broadcast, but": version(tmp_path, 3, sha256="", broadcast=BROADCAST),
    }
    for reason, event in refused.items():
        problem = check.problem(event)
        assert problem is not None and reason in problem, (reason, problem)
    assert check.problem(version(tmp_path, 3, tmp_path / "model")) is not None  # only version 0 may be the model


def test_a_reader_following_the_sequence_takes_only_the_learners_next_version(tmp_path):
    sequence = VersionSequence(rules(tmp_path))
    v0, v3, v6, v9 = (version(tmp_path, n) for n in (0, 3, 6, 9))
    assert sequence.offer(v0) and sequence.offer(v3)
    assert not sequence.offer(version(tmp_path, 3))  # announced again after a restart: not new
    with pytest.raises(WeightVersionRefused, match="out of sequence, the learner's next after 3 is 6"):
        sequence.offer(v9)
    assert sequence.accepted is v3
    assert sequence.offer(v6)
    sequence.withdraw(v6, v3)  # its folder did not hold what it announced
    assert sequence.accepted is v3 and sequence.offer(version(tmp_path, 6))


def test_a_reader_that_cannot_count_the_runs_steps_checks_the_rest(tmp_path):
    sequence = VersionSequence(rules(tmp_path, total_steps=None))
    assert sequence.offer(version(tmp_path, 0)) and sequence.offer(version(tmp_path, 7))  # maybe the last step
    with pytest.raises(WeightVersionRefused, match="not the run's folder"):
        sequence.offer(version(tmp_path, 8, tmp_path / "foreign"))


def test_a_folder_is_loaded_only_when_it_holds_the_announced_weights(tmp_path):
    folder = tmp_path / "weights" / "r" / "v000003"
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(b"weights")
    check_folder(version(tmp_path, 3, sha256=directory_sha256(folder)))
    with pytest.raises(WeightVersionRefused, match=r"hashes to .* not the announced 0000000000000000"):
        check_folder(version(tmp_path, 3))
    with pytest.raises(WeightVersionRefused, match="does not exist"):
        check_folder(version(tmp_path, 6))


def test_auto_windows_on_the_embedded_broker_with_fixed_shards_only():
    auto = Broker()
    assert auto.window_steps == "auto"
    assert resolved_window_steps(auto, save_freq=10, staleness=1, embedded=True, assignment="shard") == 25
    assert resolved_window_steps(auto, save_freq=40, staleness=1, embedded=True, assignment="shard") == 40
    assert resolved_window_steps(auto, save_freq=10, staleness=30, embedded=True, assignment="shard") == 32
    assert resolved_window_steps(auto, save_freq=10, staleness=1, embedded=False, assignment="shard") is None
    assert resolved_window_steps(auto, save_freq=10, staleness=1, embedded=True, assignment="group") is None
    kept = Broker(retention="keep")  # every record stays on the broker, for a Kafka-side replay
    assert resolved_window_steps(kept, save_freq=10, staleness=1, embedded=True, assignment="shard") is None
    for chosen in (None, 8):
        assert resolved_window_steps(Broker(window_steps=chosen), 10, 1, True, "shard") == chosen


def test_a_worker_loads_a_version_only_when_its_folder_holds_it_and_else_takes_the_learners_own(tmp_path):
    """WorkerLoop.load with a version whose folder does not hash to what it announced: not
    loaded, a dead letter at its record, and the learner's own version of that number is
    accepted when it comes."""
    import threading
    from collections import deque
    from types import SimpleNamespace

    from kafka import TopicPartition

    from streamrl.producers.weight_watcher import WeightWatcher
    from streamrl.producers.worker_loop import WorkerLoop

    folder = tmp_path / "weights" / "r" / "v000003"
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(b"the learner's weights")
    loaded: list[int] = []
    worker = SimpleNamespace(
        _load_lock=threading.Lock(), loaded_version=0, engine=SimpleNamespace(update_weights=lambda p, v: loaded.append(v))
    )
    watcher = WeightWatcher.__new__(WeightWatcher)
    watcher.sequence, watcher.refused, watcher._read_at = VersionSequence(rules(tmp_path)), deque(), {}
    v0 = version(tmp_path, 0)
    watcher.sequence.accepted = v0
    forged, genuine = version(tmp_path, 3), version(tmp_path, 3, sha256=directory_sha256(folder))
    assert watcher.sequence.offer(forged)
    watcher._read_at[forged.version] = (TopicPartition("streamrl.r.weights", 0), 17, v0)
    WorkerLoop.load(worker, forged, watcher)
    assert loaded == [] and worker.loaded_version == 0 and watcher.sequence.accepted is v0
    (letter,) = watcher.take_refused()
    assert (letter.source_offset, letter.stage) == (17, "worker") and "hashes to" in letter.error
    assert watcher.sequence.offer(genuine)
    WorkerLoop.load(worker, genuine, watcher)
    assert loaded == [3] and worker.loaded_version == 3
