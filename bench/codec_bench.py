"""Encode + decode of a 4,096-token trajectory (target < 200 µs), against JSON lists."""

import statistics
import time

import common  # noqa: F401  (puts the repo on sys.path)
import msgspec
import numpy as np

from streamrl.schema import codec
from streamrl.schema.events import Trajectory, pack_float32, pack_int32, pack_mask

N_TOKENS = 4096
REPEATS = 2000


def make_trajectory() -> Trajectory:
    rng = np.random.default_rng(0)
    return Trajectory(
        run_id="bench",
        trajectory_id="t0",
        task_id="task0",
        group_id="g0",
        tokens=pack_int32(rng.integers(0, 150_000, N_TOKENS)),
        loss_mask=pack_mask(np.r_[np.zeros(512), np.ones(N_TOKENS - 512)]),
        logprobs=pack_float32(-rng.random(N_TOKENS)),
        prompt_length=512,
        prompt_text="x" * 2000,
        response_text="y" * 8000,
        finish_reason="stop",
    )


def time_us(fn, repeats=REPEATS) -> float:
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1e6)
    return statistics.median(samples)


def main() -> None:
    event = make_trajectory()
    frame = codec.encode(event)
    streamrl_us = time_us(lambda: codec.decode(codec.encode(event)))
    # Baseline: the same record with token ids and logprobs as JSON lists of numbers.
    as_lists = msgspec.to_builtins(event)
    as_lists.update(
        tokens=np.frombuffer(event.tokens, "<i4").tolist(),
        loss_mask=list(event.loss_mask),
        logprobs=np.frombuffer(event.logprobs, "<f4").tolist(),
    )
    json_bytes = msgspec.json.encode(as_lists)
    json_us = time_us(lambda: msgspec.json.decode(msgspec.json.encode(as_lists)), repeats=300)
    print(f"codec: 4,096-token trajectory, median of {REPEATS}")
    print(
        f"  streamrl frame (packed msgpack): {len(frame):>7,} bytes  encode+decode {streamrl_us:8.1f} µs"
        f"  target < 200 µs: {'PASS' if streamrl_us < 200 else 'FAIL'}"
    )
    print(
        f"  baseline JSON lists:             {len(json_bytes):>7,} bytes  encode+decode {json_us:8.1f} µs"
        f"  ({json_us / streamrl_us:.1f}x slower)"
    )


if __name__ == "__main__":
    main()
