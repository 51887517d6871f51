"""The learner's model side: the policy (and KL reference) on its device and ranks, the
trainer, warm-up, held-out accuracy, weight versions and checkpoints.

With several processes every operation here is collective. Rank 0 drives: `call(name,
*args)` broadcasts the operation to the other ranks (`follow()` is their whole life)
and then runs it itself, so every rank enters every collective in the same order. Rank
0's arguments win: a step's samples, shares and totals are computed there once.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from streamrl.learner import parallel
from streamrl.learner.batching import TrainItem
from streamrl.learner.checkpoint import latest_checkpoint, version_folder, write_model_dir, write_weight_version
from streamrl.learner.snapshots import SnapshotStore, load_snapshot
from streamrl.learner.trainer_factory import build_trainer, unread_trainer_keys
from streamrl.learner.trainers import StepResult, Trainer, plan_step
from streamrl.learner.version_writes import VersionWrites, cpu_copy
from streamrl.learner.warmup import cross_entropy_warmup, demonstration_items, greedy_exact_match, supervised_items
from streamrl.learner.weight_broadcast import WeightBroadcaster
from streamrl.runtime.chat_template import padding_id, recipe_renderer
from streamrl.runtime.config import Recipe
from streamrl.runtime.dataset import read_rows, training_rows, validation_rows
from streamrl.runtime.lora import (
    AdapterDisabled,
    adapter_state_dict,
    base_of,
    lora_spec,
    merged_state_dict,
    with_lora,
    write_adapter_folder,
)
from streamrl.runtime.threads import learner_threads
from streamrl.runtime.weight_transport import adapter_versions, broadcast_world_size
from streamrl.schema.events import WeightBroadcast

STOP = "stop"


class Policy:
    def __init__(self, recipe: Recipe, trainer_class: type[Trainer], checkpoints: Path):
        self.recipe = recipe
        cfg = recipe.trainer
        torch.set_num_threads(learner_threads(recipe))
        self.placement = parallel.setup(cfg)
        self.checkpoints = checkpoints
        self.snapshots = SnapshotStore(checkpoints, self.placement)
        self.versions = VersionWrites()
        self.broadcaster = None
        if recipe.weight.transport == "distributed" and self.placement.is_main:
            self.broadcaster = WeightBroadcaster(
                recipe.weight.broadcast_address,
                broadcast_world_size(recipe),
                self.placement.device,
                recipe.service.inference_service.weight_sync_timeout_s,
            )
        self.checkpoint = latest_checkpoint(checkpoints)
        source = recipe.rollout_worker.model_folder()  # a snapshot holds the weights, not the model's files
        self.tokenizer = AutoTokenizer.from_pretrained(source)
        # fp32 master weights; bf16 is the compute dtype (autocast, or FSDP's policy)
        model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
        self.lora = lora_spec(cfg.lora)
        self.adapter_versions = adapter_versions(cfg.lora)
        if self.lora is not None:  # only the adapter trains; the weight versions are merged
            torch.manual_seed(cfg.seed)  # the adapter's initialisation: the same on every rank and restart
            model = with_lora(model, self.lora)
        self.model = parallel.prepare_model(model, cfg, self.placement)
        self.ref_model = None
        if recipe.algorithm.use_kl_loss or recipe.algorithm.use_kl_in_reward:
            reference = checkpoints / "reference"
            # with LoRA the reference is the base model: the same weights, the adapter off
            self.ref_model = (
                AdapterDisabled(self.model)
                if self.lora is not None
                else self._load_reference(reference if reference.exists() else source)
            )
        self.trainer = build_trainer(
            trainer_class, recipe, self.model, padding_id(self.tokenizer), ref_model=self.ref_model, placement=self.placement
        )
        if self.checkpoint is not None:
            if not (self.checkpoint / "shards").is_dir():
                raise RuntimeError(
                    f"{self.checkpoint}: a snapshot of an earlier format (whole model files, no "
                    "shards/); resume it with the StreamRL version that wrote it"
                )
            load_snapshot(self.checkpoint, self.model, self.trainer.optimizer)

    def _load_reference(self, folder) -> torch.nn.Module:
        device = torch.device("cpu") if self.recipe.trainer.ref_model_offload else self.placement.device
        loaded: torch.nn.Module = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
        ref = loaded.to(device).eval()
        for p in ref.parameters():
            p.requires_grad_(False)
        return ref

    @property
    def is_main(self) -> bool:
        return self.placement.is_main

    # --- rank 0 drives, the others follow --------------------------------------------------------
    def call(self, name: str, *args, **rank0_only):
        """Run operation `name` on every rank; `rank0_only` keyword arguments (a step's
        samples) stay on rank 0, which hands out what the others need itself."""
        parallel.broadcast_object((name, args), self.placement)
        return getattr(self, name)(*args, **rank0_only)

    def follow(self) -> None:
        """A rank > 0: run what rank 0 calls, until it says stop."""
        while True:
            name, args = parallel.broadcast_object(None, self.placement)
            if name == STOP:
                return
            getattr(self, name)(*args)

    def stop_followers(self) -> None:
        if self.placement.world_size > 1:
            parallel.broadcast_object((STOP, ()), self.placement)

    # --- collective operations ---------------------------------------------------------------------
    def train(self, lr: float, items: list[TrainItem] | None = None) -> StepResult:
        """One optimizer step: rank 0 gives the step's samples (the guide's hooks run there,
        on all of them); each rank trains its share by token count."""
        for group in self.trainer.optimizer.param_groups:
            group["lr"] = lr
        plan = None
        if self.is_main:
            if items is None:
                raise ValueError("the main rank gives the step's samples")
            prepared, hook_metrics = self.trainer.prepare(items)
            plan = (
                plan_step(prepared, self.placement.world_size, self.trainer.micro_batches),
                {key: float(value) for key, value in hook_metrics.items()},
            )
        plan, hook_metrics = parallel.broadcast_object(plan, self.placement)
        result = self.trainer.train(plan.shares[self.placement.rank], plan.totals, plan.rounds)
        result.metrics.update(hook_metrics)
        result.samples = int(plan.totals.sequences)
        return result

    def warm_up(self) -> dict:
        """Cross-entropy warm-up on the training rows' answers (or demonstrations), each
        rank on its share of every batch; greedy held-out accuracy before and after."""
        cfg, data = self.recipe.trainer, self.recipe.data
        if not cfg.warmup_cross_entropy_steps:
            return {}
        before = self.val_accuracy()
        if cfg.warmup_messages_key:  # multi-turn demonstrations (agent recipes)
            rows = read_rows(data.data_files, data.type, (cfg.warmup_messages_key,))
            items = demonstration_items(rows, recipe_renderer(self.recipe, self.tokenizer), cfg.warmup_messages_key)
        else:
            rows = training_rows(data, (data.prompt_key, data.answer_key))
            items = supervised_items(rows, recipe_renderer(self.recipe, self.tokenizer), data.prompt_key, data.answer_key)
        target = cfg.warmup_until_accuracy
        done = (lambda: self.val_accuracy() >= target) if target is not None else None
        details = cross_entropy_warmup(
            self.model,
            self.tokenizer,
            items,
            cfg.warmup_cross_entropy_steps,
            cfg.warmup_batch_size,
            dataclasses.replace(cfg, lr=cfg.warmup_lr or cfg.lr),
            cfg.seed,
            self.placement,
            done=done,
            check_every=cfg.warmup_check_every,
        )
        return {**details, "val_accuracy_before_warmup": before, "val_accuracy_after_warmup": self.val_accuracy()}

    def val_accuracy(self) -> float:
        """Greedy exact-match accuracy on the validation rows, in the learner (used where
        no rollout worker validates: around a warm-up, and around a replayed run). Every
        rank generates the same (sharded forwards are collectives)."""
        val_cfg = self.recipe.validate.data
        worker = self.recipe.rollout_worker
        if not val_cfg.data_files or worker.type != "single_turn" or worker.custom_rollout_worker_module_path:
            return float("nan")  # only the rollout workers know how other workers' tasks are done
        val_rows = validation_rows(val_cfg.data_files, val_cfg.type, val_cfg.max_rows)
        with self.placement.autocast():
            accuracy = greedy_exact_match(
                self.model,
                recipe_renderer(self.recipe, self.tokenizer),
                val_rows,
                val_cfg.prompt_key,
                self.recipe.data.answer_key,
                worker.max_response_length,
            )
        parallel.reshard(self.model, self.placement)
        return accuracy

    def write_version(self, root: Path, version: int) -> Path | None:
        """The weights as a full safetensors folder (rank 0 writes; None on other ranks);
        with LoRA, the base model with the adapter merged in."""
        gathered = parallel.full_state_dict(self.model, self.placement)
        if not self.is_main:
            return None
        return self._write_version_folder(root, version, self._version_state(gathered))

    def start_version(self, root: Path, version: int) -> WeightBroadcast | None:
        """Copy the weights now (gathered to rank 0 when sharded; the adapter merged with
        LoRA) and write them as version `version` in the background (learner/version_writes.py).
        With `weight.transport: distributed` they are broadcast to the servers first; the
        broadcast's rendezvous, to announce, is returned (rank 0)."""
        gathered = parallel.full_state_dict(self.model, self.placement)
        if not self.is_main:
            return None
        self.versions.wait_idle()  # one copy in flight at most
        state = self._version_state(gathered)
        if self.broadcaster is None:
            self.versions.submit(version, lambda: self._write_version_folder(root, version, state))
            return None
        broadcaster = self.broadcaster
        manifest = broadcaster.open(version, state)

        def broadcast_then_write() -> Path:
            broadcaster.send(manifest, state)
            return self._write_version_folder(root, version, state)

        self.versions.submit(version, broadcast_then_write)
        return manifest

    def _version_state(self, gathered: dict | None) -> dict:
        """What a weight version holds: the gathered weights (sharded) or a copy of the
        model's; with LoRA, the adapter merged in, or (`trainer.lora.versions: adapter`)
        the adapter alone. Both writers use it, so a version written in the background and
        one written now are the same bytes (the resume check)."""
        if self.adapter_versions:
            state = gathered if gathered is not None else self.model.state_dict()
            return cpu_copy(adapter_state_dict(state))
        state = gathered if gathered is not None else cpu_copy(self.model.state_dict())
        return merged_state_dict(state, self.lora.scale) if self.lora is not None else state

    def _write_version_folder(self, root: Path, version: int, state: dict) -> Path:
        if self.adapter_versions:
            root.mkdir(parents=True, exist_ok=True)
            return write_adapter_folder(version_folder(root, version), self.model, state)
        return write_weight_version(root, version, base_of(self.model), self.tokenizer, state)

    def written_versions(self, wait: bool = False) -> list[tuple[int, Path]]:
        """Rank 0: the versions written since the last call, in order."""
        return self.versions.written(wait)

    def write_checkpoint(self, step: int, state: dict, keep_every: int) -> None:
        """Start the snapshot of `step` (sharded, written in the background)."""
        self.snapshots.save(step, self.model, self.trainer.optimizer, state, keep_every)

    def finish_checkpoint(self, wait: bool) -> bool:
        """Whether the snapshot being written is complete (`wait`: once it is)."""
        if wait:
            self.snapshots.finish()
            return True
        return self.snapshots.ready()

    def unread_config_keys(self) -> list[str]:
        """The trainer's own algorithm keys it has not read (runtime/config_reads.py)."""
        return unread_trainer_keys(self.trainer, self.recipe)

    def fix_reference(self) -> None:
        """The KL reference is the policy RL starts from (after any warm-up); with LoRA it
        stays the base model (the adapter off), which needs no second copy."""
        if self.lora is not None:
            return
        state = parallel.full_state_dict(self.model, self.placement)
        folder = self.checkpoints / "reference"
        if self.is_main:
            write_model_dir(folder, self.model, self.tokenizer, state)
        if self.placement.world_size > 1:
            torch.distributed.barrier()
        self.ref_model = self._load_reference(folder)
        self.trainer.ref_model = self.ref_model

    def close(self) -> None:
        self.versions.close()
        parallel.close(self.placement)
