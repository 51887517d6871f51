"""How weight versions reach the inference servers (`weight.transport`), and where the
`distributed` transport can work.

`disk`: every server loads the version's safetensors folder (`/update_weights_from_disk`).
`distributed`: the learner's rank 0 broadcasts the tensors to every server over a process
group of its own per version (SGLang's `/init_weights_update_group` and
`/update_weights_from_distributed`; gloo on CPU, NCCL on CUDA). The folder is still
written, in the background: it is what a server or worker that restarts loads, and the
fallback when a broadcast fails. Every server of every worker joins each broadcast, so
the group's size is known from the recipe before any server starts.
"""

from __future__ import annotations

# Keys of a version's rendezvous store besides the process group's own: which version it
# is for; the next free rank (each worker claims its servers' ranks with an atomic add);
# and the learner's decision, once every rank is claimed (1) or the timeout passed (0).
# A server only joins the group after a 1: SGLang's join waits 30 minutes for a rank
# that never comes, with its scheduler blocked, so a group must not start unless whole.
VERSION_KEY = "streamrl/version"
RANK_OFFSET_KEY = "streamrl/rank_offset"
GO_KEY = "streamrl/go"

RANK_ARGS = ("tp-size", "tp_size")
UNSUPPORTED_ARGS = ("dp-size", "dp_size", "pp-size", "pp_size")


def server_int(server_args: dict, key: str, default: int = 1) -> int:
    """`service.inference_service.server_args[key]` as a number, or a ValueError naming it."""
    value = server_args.get(key, default)
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ValueError(f"service.inference_service.server_args.{key}: {value!r} is not a whole number") from None


def ranks_per_server(server_args: dict) -> int:
    """Processes of one SGLang server that join a broadcast group (its tensor-parallel ranks)."""
    for key in RANK_ARGS:
        if key in server_args:
            return server_int(server_args, key)
    return 1


def broadcast_world_size(recipe) -> int:
    """The learner's rank 0 and every server rank of every worker."""
    service = recipe.service.inference_service
    servers_per_worker = len(service.url) if isinstance(service.url, list) else (1 if service.url else service.num_servers)
    return 1 + recipe.rollout_worker.num_workers * servers_per_worker * ranks_per_server(service.server_args)


def adapter_versions(lora) -> bool:
    """Whether the recipe's `trainer.lora` makes weight versions the adapter alone."""
    return lora is not None and lora.versions == "adapter"


def adapter_version_problems(recipe) -> list[str]:
    """`trainer.lora.versions: adapter` only where servers load adapters."""
    lora, service = recipe.trainer.lora, recipe.service.inference_service
    if not adapter_versions(lora):
        return []
    prefix = "trainer.lora.versions: adapter "
    problems = []
    if service.backend != "sglang":
        problems.append(
            f"{prefix}needs SGLang servers (service.inference_service.backend sglang; this recipe's is "
            f"{service.backend}): the embedded engine and OpenAI servers load whole models"
        )
    if recipe.weight.transport == "distributed":
        problems.append(
            f"{prefix}is a folder of megabytes that each server loads; weight.transport distributed "
            f"broadcasts whole models (use one or the other)"
        )
    if "lm_head" in lora.target_modules:
        problems.append(
            f"{prefix}with 'lm_head' in target_modules: the adapter unties the output embeddings, "
            f"which the servers' base model shares with the input ones; use versions: merged"
        )
    return problems


def transport_problems(recipe) -> list[str]:
    """`weight.transport: distributed` only where a broadcast can reach every server
    exactly once and be applied when it arrives."""
    problems = adapter_version_problems(recipe)
    weight, service = recipe.weight, recipe.service.inference_service
    if weight.transport != "distributed":
        if weight.broadcast_address != "127.0.0.1":
            problems.append("weight.broadcast_address: read only with weight.transport distributed")
        return problems
    prefix = "weight.transport: distributed "
    if service.backend != "sglang":
        problems.append(
            f"{prefix}needs SGLang servers (service.inference_service.backend sglang; this recipe's is "
            f"{service.backend}): the embedded engine and OpenAI servers load folders"
        )
    if recipe.trainer.type.startswith("remote_api"):
        problems.append(f"{prefix}needs the self-hosted learner: a remote trainer's weights stay in the training service")
    if weight.sync_mode == "batch-async":
        problems.append(
            f"{prefix}is applied as each version arrives, which batch-async forbids (versions change "
            f"only between a worker's batches); use sync or fully-async, or weight.transport disk"
        )
    if service.url and recipe.rollout_worker.num_workers > 1:
        problems.append(
            f"{prefix}with service.inference_service.url and rollout_worker.num_workers > 1: every "
            f"worker would join the same servers to the group; give each worker managed servers "
            f"(num_servers) or run one worker"
        )
    try:
        unsupported = [key for key in UNSUPPORTED_ARGS if server_int(service.server_args, key) > 1]
        ranks_per_server(service.server_args)
    except ValueError as exc:
        return [*problems, str(exc)]
    if unsupported:
        problems.append(f"{prefix}broadcasts to tensor-parallel ranks only (server_args {', '.join(unsupported)} > 1)")
    return problems
