"""Where the learner computes: device, precision, and processes.

One learner process, or `trainer.nproc_per_node` x `trainer.nnodes` of them under
torchrun. With more than one, the model is sharded with FSDP2 (`fully_shard`) under a
mixed-precision policy (bf16 parameters for compute where asked, fp32 gradient
reduction, fp32 master weights); on CPU the processes talk over gloo, so the tests run
the same code as a GPU cluster (nccl).

What the ranks share, and how:
- rank 0 alone reads the samples topic and publishes events; it hands every rank its
  share of a step (`shares_by_tokens`) with `broadcast_object`;
- every rank runs the same number of micro-batches (FSDP gathers parameters in every
  forward, a collective), short shares padded with zero-weight micro-batches;
- the loss is normalised by the whole step's token count; FSDP averages gradients over
  ranks, so each rank's loss is multiplied by the world size to make the sum exact;
- weight versions: the full state dict is gathered (a collective) and rank 0 writes it;
  snapshots: each rank writes its own shards (learner/snapshots.py).
"""

from __future__ import annotations

import contextlib
import datetime
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from streamrl.runtime.config import Trainer as TrainerConfig
from streamrl.runtime.device import resolve_device
from streamrl.runtime.lora import base_of

if TYPE_CHECKING:
    from transformers import PreTrainedModel


@dataclass
class Placement:
    device: torch.device
    rank: int = 0
    world_size: int = 1
    sharded: bool = False  # FSDP2 over the process group
    autocast_dtype: torch.dtype | None = None  # bf16 compute of an unsharded model

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def autocast(self):
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)


def compute_dtype(name: str, device: torch.device) -> str:
    """trainer.dtype with auto made concrete: bfloat16 on a CUDA device with bf16
    support, float32 elsewhere (a CPU's bf16 matmuls are slower than its float32 ones)."""
    if name != "auto":
        return name
    return "bfloat16" if device.type == "cuda" and torch.cuda.is_bf16_supported() else "float32"


def setup(cfg: TrainerConfig) -> Placement:
    """Join the process group when torchrun started this process; pick the device."""
    device = resolve_device(cfg.device)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    bf16 = compute_dtype(cfg.dtype, device) == "bfloat16"
    if world == 1:
        return Placement(device, autocast_dtype=torch.bfloat16 if bf16 else None)
    rank, local_rank = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    if device.type == "cuda":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        # Followers wait in a broadcast while rank 0 waits for rollouts: a long timeout,
        # or a slow step of the run would end the job.
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", timeout=datetime.timedelta(hours=24))
    return Placement(device, rank, world, sharded=True)


def prepare_model(model: PreTrainedModel, cfg: TrainerConfig, placement: Placement) -> torch.nn.Module:
    """Gradient checkpointing, the device, and FSDP2 sharding (each decoder layer, then
    the whole model) when there are several processes."""
    if cfg.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.config.use_cache = False
    model.to(placement.device)  # type: ignore[arg-type]  # transformers types .to through its own wrapper
    if not placement.sharded:
        return model
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = MixedPrecisionPolicy(
        param_dtype=torch.bfloat16 if compute_dtype(cfg.dtype, placement.device) == "bfloat16" else torch.float32,
        reduce_dtype=torch.float32,
    )
    for layer in decoder_layers(model):
        fully_shard(layer, mp_policy=policy)
    # the root is the Hugging Face model, also under a LoRA wrapper: peft's generate calls
    # the base model's, which must be the module whose forward gathers the root's shards
    fully_shard(base_of(model), mp_policy=policy)
    return model


def reshard(model: torch.nn.Module, placement: Placement) -> None:
    """After a forward with no backward (generation): FSDP2 keeps the root module's
    parameters gathered after its forward, expecting a backward; left so, the module's
    parameters are the gathered copies, and an optimizer made then would update copies
    that are thrown away. Tested: a warm-up after a held-out generation trains."""
    if placement.sharded:
        for module in model.modules():
            if hasattr(module, "reshard"):
                module.reshard()  # type: ignore[operator]  # an FSDP2 module (found by hasattr)


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The transformer blocks of a Hugging Face causal LM (`model.model.layers` for the
    Llama/Qwen family), else every direct child holding parameters."""
    model = base_of(model)  # under a LoRA wrapper, the base model's blocks
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if layers is not None:
        return list(layers)
    return [m for m in model.children() if any(True for _ in m.parameters())]


def broadcast_object(value, placement: Placement):
    """Rank 0's `value` on every rank (pickled; a step's samples are small)."""
    if placement.world_size == 1:
        return value
    box = [value if placement.is_main else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def all_reduce_metrics(values: dict[str, float], placement: Placement, op=None) -> dict[str, float]:
    """Per-rank metrics combined over ranks (every rank has the same keys): summed, or
    with `op` (dist.ReduceOp.MAX for maxima)."""
    if placement.world_size == 1 or not values:
        return values
    keys = sorted(values)
    tensor = torch.tensor([values[k] for k in keys], dtype=torch.float64)
    if placement.device.type == "cuda":
        tensor = tensor.to(placement.device)
    dist.all_reduce(tensor, op=op or dist.ReduceOp.SUM)
    return dict(zip(keys, tensor.tolist()))


def all_reduce_sums(values: dict[str, float], placement: Placement) -> dict[str, float]:
    """Sums of per-rank metric sums."""
    return all_reduce_metrics(values, placement)


def all_reduce_maxima(values: dict[str, float], placement: Placement) -> dict[str, float]:
    """Maxima over ranks of per-rank maxima."""
    return all_reduce_metrics(values, placement, dist.ReduceOp.MAX)


def shares_by_tokens(lengths: list[int], world_size: int) -> list[list[int]]:
    """Indices split into `world_size` shares of near-equal token counts (longest first,
    each to the lightest share), each share in its original order."""
    shares: list[list[int]] = [[] for _ in range(world_size)]
    loads = [0] * world_size
    for index in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        lightest = loads.index(min(loads))
        shares[lightest].append(index)
        loads[lightest] += lengths[index]
    return [sorted(share) for share in shares]


def full_state_dict(model: torch.nn.Module, placement: Placement) -> dict | None:
    """The whole model's weights on the CPU, on rank 0 (None elsewhere); for an unsharded
    model, None: `save_pretrained` reads the module itself."""
    if not placement.sharded:
        return None
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return tied_as_one(state, model) if placement.is_main else None


def tied_as_one(state: dict, model: torch.nn.Module) -> dict:
    """Names that are one parameter in the model (tied input and output embeddings) point
    at one gathered tensor, as in an unsharded model's state dict: `save_pretrained` then
    writes it once, and a version written by several ranks holds the same tensors as one
    written by a single process (the gathered copies were two tensors: an extra
    `lm_head.weight`)."""
    owner_of: dict[int, str] = {}
    for name, parameter in model.named_parameters(remove_duplicate=False):
        owner = owner_of.setdefault(id(parameter), name)
        if owner != name and owner in state and name in state:
            state[name] = state[owner]
    return state


def close(placement: Placement) -> None:
    """Leave the process group together: a rank that tore its connections down while
    another was still in the group was seen to abort (SIGABRT) in gloo."""
    if placement.sharded and dist.is_initialized():
        try:
            dist.barrier()
        except RuntimeError:  # a rank is gone already: nothing left to wait for
            pass
        dist.destroy_process_group()
