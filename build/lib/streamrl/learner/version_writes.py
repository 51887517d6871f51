"""Weight versions written in the background from a copy of the weights, so the next
step starts at once; announced in order once complete.

A version's weights are copied on the training thread (gathered to rank 0 when sharded),
then one writer thread turns the copy into a model folder. At most one version is in
flight: a second copy waits until the first is written, which bounds the memory to one
extra copy of the weights. A write that fails raises on the training thread, at the next
poll: nothing is announced that is not on disk.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import torch


def cpu_copy(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The weights as they are now, on the CPU, unaffected by the steps that follow. Names
    that share a tensor (tied input and output embeddings) share its copy, so the folder
    written from the copy is the one written from the model itself, byte for byte."""
    copies: dict[tuple, torch.Tensor] = {}
    out = {}
    for name, value in state.items():
        key = (value.data_ptr(), value.dtype, tuple(value.shape), value.stride())
        if key not in copies:
            copies[key] = value.detach().to("cpu", copy=True)
        out[name] = copies[key]
    return out


class VersionWrites:
    def __init__(self):
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="weight-version")
        self._pending: deque[tuple[int, Future]] = deque()

    def wait_idle(self) -> None:
        """Until no write is in flight (before taking the next copy)."""
        for _, future in self._pending:
            future.exception()  # waits; the error, if any, is raised by written()

    def submit(self, version: int, write: Callable[[], Path]) -> None:
        self._pending.append((version, self._pool.submit(write)))

    def done(self, version: int, folder: Path) -> None:
        """A version written on the calling thread."""
        future: Future = Future()
        future.set_result(folder)
        self._pending.append((version, future))

    def written(self, wait: bool = False) -> list[tuple[int, Path]]:
        """The versions whose folders are complete, oldest first (`wait`: all of them)."""
        finished = []
        while self._pending and (wait or self._pending[0][1].done()):
            version, future = self._pending.popleft()
            finished.append((version, future.result()))
        return finished

    def close(self) -> None:
        self._pool.shutdown(wait=True)
