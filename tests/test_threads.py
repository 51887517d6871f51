"""Torch thread budgets of the learner and workers (runtime/threads.py), by hand."""

from __future__ import annotations

import dataclasses
import os

import pytest

from streamrl.runtime.recipe import prepare_recipe
from streamrl.runtime.settings import SettingsError
from streamrl.runtime.threads import learner_threads, usable_cores, worker_threads
from tests.conftest import REPO

RECIPE = REPO / "recipes" / "arith" / "recipe.yaml"


def recipe_with(sync_mode="fully-async", workers=1, ranks=1, backend="embedded", learner=None, worker=None):
    recipe = prepare_recipe(RECIPE)
    return dataclasses.replace(
        recipe,
        weight=dataclasses.replace(recipe.weight, sync_mode=sync_mode),
        rollout_worker=dataclasses.replace(recipe.rollout_worker, num_workers=workers, num_threads=worker),
        trainer=dataclasses.replace(recipe.trainer, nproc_per_node=ranks, num_threads=learner),
        service=dataclasses.replace(
            recipe.service, inference_service=dataclasses.replace(recipe.service.inference_service, backend=backend)
        ),
    )


def test_in_sync_mode_the_learner_and_workers_take_turns_so_each_gets_every_core():
    recipe = recipe_with("sync", workers=2, ranks=2)
    assert (learner_threads(recipe, cores=8), worker_threads(recipe, cores=8)) == (4, 4)  # 8 / 2 ranks, 8 / 2 workers


def test_asynchronous_modes_split_the_cores_between_every_computing_process():
    recipe = recipe_with("fully-async", workers=1, ranks=1)
    assert (learner_threads(recipe, cores=2), worker_threads(recipe, cores=2)) == (1, 1)
    recipe = recipe_with("batch-async", workers=2, ranks=1)
    assert (learner_threads(recipe, cores=16), worker_threads(recipe, cores=16)) == (5, 5)  # 16 // 3
    assert learner_threads(recipe_with(workers=3), cores=2) == 1  # never less than one


def test_workers_that_sample_on_a_server_elsewhere_leave_the_cores_to_the_learner(monkeypatch):
    import streamrl.runtime.threads

    recipe = recipe_with("fully-async", workers=2, backend="sglang")
    external = dataclasses.replace(
        recipe,
        service=dataclasses.replace(
            recipe.service, inference_service=dataclasses.replace(recipe.service.inference_service, url="http://127.0.0.1:30000")
        ),
    )
    assert learner_threads(external, cores=8) == 8
    # managed servers on a CPU-only machine sample beside the learner: one share each
    monkeypatch.setattr(streamrl.runtime.threads, "cuda_present", lambda: False)
    assert learner_threads(recipe, cores=8) == 2  # 8 // (1 learner + 2 servers)
    assert learner_threads(recipe_with("sync", workers=2, backend="sglang"), cores=8) == 8  # they take turns
    monkeypatch.setattr(streamrl.runtime.threads, "cuda_present", lambda: True)
    assert learner_threads(recipe, cores=8) == 8  # the servers sample on the GPUs


def test_a_number_in_the_recipe_wins():
    recipe = recipe_with("sync", learner=3, worker=5)
    assert (learner_threads(recipe, cores=8), worker_threads(recipe, cores=8)) == (3, 5)


def test_streamrl_cores_narrows_the_cores_a_run_splits(monkeypatch):
    affinity = len(os.sched_getaffinity(0))
    monkeypatch.setenv("STREAMRL_CORES", "1")
    assert usable_cores() == 1
    assert (learner_threads(recipe_with("sync")), worker_threads(recipe_with("sync"))) == (1, 1)
    monkeypatch.setenv("STREAMRL_CORES", str(affinity + 64))  # never more than the process may run on
    assert usable_cores() == affinity
    monkeypatch.delenv("STREAMRL_CORES")
    assert learner_threads(recipe_with("sync")) == affinity
    for bad in ("0", "two", "-1"):
        monkeypatch.setenv("STREAMRL_CORES", bad)
        with pytest.raises(SettingsError, match=f"STREAMRL_CORES='{bad}'"):
            usable_cores()
