"""How many torch threads the computing processes of a run use when the recipe leaves
it open (`trainer.num_threads`, `rollout_worker.num_threads` unset).

The learner's ranks and the rollout workers (with the embedded engine, which samples in
the worker's own process) are what compute. In `sync` mode they take turns: the workers
sample while the learner waits for their rollouts, then the learner trains while the
workers wait for its weights. So each may use every core this machine gives the run.
In the asynchronous modes they compute at the same time, and the cores are split: one
share for each learner rank and one for each worker. More threads than that would only
make them take cores from each other.
"""

from __future__ import annotations

import os

from streamrl.runtime.config import Recipe
from streamrl.runtime.settings import int_env


def usable_cores() -> int:
    """The cores this run may use: the ones this process may run on (its CPU affinity,
    which a container's cpuset narrows), or fewer where `STREAMRL_CORES` says so.

    Where several runs share a machine (or a test suite runs them side by side), each
    taking every core would put more busy torch threads than cores on it, and torch's
    threads spin while they wait for each other: every run then goes several times slower
    than with one thread each."""
    try:
        affinity = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        affinity = os.cpu_count() or 1
    return min(affinity, int_env("STREAMRL_CORES", affinity))


def computing_workers(recipe: Recipe) -> int:
    """Processes that sample on this machine's CPUs: rollout workers with the embedded
    engine, and the SGLang servers the workers start themselves (managed servers run on
    this machine; on a CPU-only machine they compute beside the learner)."""
    service = recipe.service.inference_service
    if service.backend == "embedded":
        return recipe.rollout_worker.num_workers
    if service.backend == "sglang" and not service.url and not cuda_present():
        return recipe.rollout_worker.num_workers * service.num_servers
    return 0


def cuda_present() -> bool:
    """Whether this machine has an NVIDIA driver (managed servers then sample on its GPUs),
    without importing torch."""
    return os.path.exists("/proc/driver/nvidia/version")


def learner_ranks(recipe: Recipe) -> int:
    """Learner processes that train here (a remote trainer trains elsewhere)."""
    return 0 if recipe.trainer.type.startswith("remote_api") else recipe.trainer.nproc_per_node


def learner_threads(recipe: Recipe, cores: int | None = None) -> int:
    """torch threads of each learner rank."""
    return share_of_cores(recipe.trainer.num_threads, learner_ranks(recipe), computing_workers(recipe), recipe, cores)


def worker_threads(recipe: Recipe, cores: int | None = None) -> int:
    """torch threads of each rollout worker."""
    return share_of_cores(recipe.rollout_worker.num_threads, computing_workers(recipe), learner_ranks(recipe), recipe, cores)


def share_of_cores(configured: int | None, alike: int, others: int, recipe: Recipe, cores: int | None) -> int:
    """`configured`, or the cores split between `alike` processes of this kind and, when
    they compute at the same time (the asynchronous modes), the `others`."""
    if configured is not None:
        return configured
    sharing = max(alike, 1) if recipe.weight.sync_mode == "sync" else max(alike, 1) + others
    return max(1, (cores or usable_cores()) // sharing)
