"""The recipe's sections about weights: `trainer.lora` (what trains, and what a weight
version of a LoRA model is) and `weight` (when versions are published and how they reach
the inference servers). Re-exported by runtime/config.py with the other sections."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from streamrl.runtime.config_fields import knob, only


@dataclass
class Lora:
    rank: int = knob(8, "the adapter's rank r (A is r x in, B is out x r)", ge=1)
    alpha: float = knob(16.0, "the update is scaled by alpha / rank", gt=0.0)
    dropout: float = knob(0.0, "dropout on the adapter's input in training", ge=0.0, lt=1.0)
    target_modules: list = knob(
        help="the linear layers that get an adapter (module names; 'lm_head' unties a tied output embedding)",
        factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    )
    versions: Literal["merged", "adapter"] = knob(
        "merged",
        "what a weight version is: the model with the adapter merged in (any server loads it), or the "
        "adapter alone (SGLang servers started with LoRA load it with /load_lora_adapter: megabytes per "
        "version instead of the model)",
    )


@dataclass
class Weight:
    type: str = only("default", "weights travel as safetensors folders announced on the weights topic")
    sync_mode: Literal["sync", "batch-async", "fully-async"] = knob(
        "sync",
        "when rollouts may use older weights: never (sync), within a step's batch, or up to "
        "staleness_threshold versions (fully-async)",
    )
    staleness_threshold: int = knob(
        1,
        "a sample more versions behind the learner than this is dropped, counted (with trajectory_pool.batch_groups "
        "first_complete: behind the step its group was published for)",
        ge=0,
    )
    sync_every: int = knob(
        1,
        "publish a weight version every this many steps (and at the last): fewer writes and "
        "loads of a large model; pacing, staleness_threshold and validate.eval.compute_interval "
        "count published versions",
        ge=1,
    )
    sync_weight_path: str = knob("runs/${experiment_name}/weights", "where weight versions go (relative: under STREAMRL_HOME)")
    # distributed: SGLang's update_weights_from_distributed, a process group per version
    # between the learner's rank 0 and every server (gloo on CPU, NCCL on CUDA)
    transport: Literal["disk", "distributed"] = knob(
        "disk",
        "how a version reaches the SGLang servers: they load its folder (disk), or the learner broadcasts "
        "the tensors to them (distributed; the folder is still written, in the background, for a server "
        "or worker that restarts)",
    )
    broadcast_address: str = knob(
        "127.0.0.1", "distributed: the learner host's address as the servers reach it (its rendezvous store listens there)"
    )
