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

from runtime.config import Recipe


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity, which a container's cpuset
    narrows), not the machine's count."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def computing_workers(recipe: Recipe) -> int:
    """Rollout worker processes that sample on this machine's CPUs themselves."""
    embedded = recipe.service.inference_service.backend == "embedded"
    return recipe.rollout_worker.num_workers if embedded else 0


def learner_ranks(recipe: Recipe) -> int:
    """Learner processes that train here (a remote trainer trains elsewhere)."""
    return 0 if recipe.trainer.type.startswith("remote_api") else recipe.trainer.nproc_per_node


def learner_threads(recipe: Recipe, cores: int | None = None) -> int:
    """torch threads of each learner rank."""
    if recipe.trainer.num_threads is not None:
        return recipe.trainer.num_threads
    cores = cores or usable_cores()
    ranks = max(learner_ranks(recipe), 1)
    sharing = ranks if recipe.weight.sync_mode == "sync" else ranks + computing_workers(recipe)
    return max(1, cores // sharing)


def worker_threads(recipe: Recipe, cores: int | None = None) -> int:
    """torch threads of each rollout worker."""
    if recipe.rollout_worker.num_threads is not None:
        return recipe.rollout_worker.num_threads
    cores = cores or usable_cores()
    workers = max(computing_workers(recipe), 1)
    sharing = workers if recipe.weight.sync_mode == "sync" else workers + learner_ranks(recipe)
    return max(1, cores // sharing)
