"""Reading back what the trackers wrote, with each tracker's own reader where it has one:
TensorBoard's EventAccumulator, MLflow's client. W&B (0.31) ships no Python reader for
an offline run's `.wandb` file; the file is W&B's header followed by a LevelDB log of
protobuf `Record`s, read here with W&B's own protobuf classes."""

from __future__ import annotations

import json
import struct
from pathlib import Path

BLOCK = 32768  # LevelDB log block size
HEADER = 7  # W&B's file header (":W&B", magic, version); each log record's header is 7 bytes too
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def leveldb_records(data: bytes, start: int = HEADER):
    position, pending = start, b""
    while position + 7 <= len(data):
        left_in_block = BLOCK - position % BLOCK
        if left_in_block < 7:  # block trailer: padding
            position += left_in_block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[position : position + 7])
        body = data[position + 7 : position + 7 + length]
        position += 7 + length
        if kind == FULL:
            yield body
        elif kind == FIRST:
            pending = body
        elif kind == MIDDLE:
            pending += body
        elif kind == LAST:
            yield pending + body
        else:  # zero padding after the last record
            break


def wandb_offline_history(run_dir: Path) -> tuple[list[dict], dict]:
    """(the logged rows, the config) of a W&B offline run folder."""
    from wandb.proto import wandb_internal_pb2 as pb

    path = next(run_dir.glob("*.wandb"))
    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B run file"
    rows, config = [], {}
    for body in leveldb_records(data):
        record = pb.Record()
        record.ParseFromString(body)
        kind = record.WhichOneof("record_type")
        if kind == "history":
            rows.append({item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item})
        elif kind == "config":
            config.update({item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.config.update})
    return rows, config


def tensorboard_scalars(log_dir: Path) -> dict[str, dict[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(log_dir))
    accumulator.Reload()
    return {tag: {event.step: event.value for event in accumulator.Scalars(tag)} for tag in accumulator.Tags()["scalars"]}


def mlflow_metrics(tracking_uri: str, run_id: str) -> dict[str, dict[int, float]]:
    """StreamRL run `run_id`'s metrics in MLflow, each as {step: value}; the run found by its tag."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    found = client.search_runs([e.experiment_id for e in client.search_experiments()], f"tags.`streamrl.run_id` = '{run_id}'")
    assert len(found) == 1, f"{len(found)} MLflow runs for {run_id}"
    keys = found[0].data.metrics
    return {key: {m.step: m.value for m in client.get_metric_history(found[0].info.run_id, key)} for key in keys}
