"""The guide's recipe keys that StreamRL spells in one other place, and the guide's keys
it refuses, each with the reason (docs/seed_api.md prints these tables).

`apply_guide_forms(values)` moves every guide spelling to StreamRL's key in a recipe
mapping (in place) before it is checked, and returns the problems: a key given in both
spellings with different values, or a refused key. Nothing is dropped: a moved key is
checked like any other, so a typo inside it is still named.
"""

from __future__ import annotations

from typing import Any

# guide key -> (StreamRL key, why StreamRL keeps it there)
MOVED: dict[str, tuple[str, str]] = {
    "rollout_worker.nexau_agent_config_path": (
        "rollout_worker.agent_config_path",
        "the agent loop is StreamRL's own; the config keeps the guide's shape",
    ),
    "rollout_worker.nexau_agent_workspace": ("rollout_worker.agent_workspace", "as above"),
    "trainer.algorithm": (
        "algorithm",
        "one algorithm section: the stream processor (advantages) and the learner (loss) both read it",
    ),
    "trainer.train_service": ("service.train_service", "services live under service:"),
    "train_service": ("service.train_service", "services live under service:"),
    "trainer.sync_weight_path": ("weight.sync_weight_path", "weight sync settings live under weight:"),
    "trainer.max_prompt_length": ("rollout_worker.max_prompt_length", "the rollout worker enforces it"),
    "trainer.max_response_length": ("rollout_worker.max_response_length", "the rollout worker samples it"),
    "data.rollout_repeat_n": (
        "rollout_worker.rollout_repeat_n",
        "the samples per prompt; the publisher and the worker read it there",
    ),
    "data.max_response_length": ("rollout_worker.max_response_length", "the rollout worker samples it"),
    "algorithm.critic.kl_ctrl": ("algorithm.kl_ctrl", "GRPO has no critic; the KL controller is the algorithm's"),
    "algorithm.kl_ctrl.kl_reward_coef": ("algorithm.kl_ctrl.kl_coef", "one coefficient for the KL in the reward and the KL loss"),
    "service.inference_service.base_url": ("service.inference_service.url", "url takes one server or a list"),
    "algorithm.off_policy_correction": (
        "algorithm.policy_loss",
        "StreamRL's earlier name: the key selects the whole policy loss (GSPO included), not only a correction",
    ),
}

# guide key -> (values that are accepted because they are what StreamRL does, why others are refused)
REFUSED: dict[str, tuple[tuple, str]] = {
    "launch_mode": (
        ("local",),
        "`streamrl run` starts local processes; on a cluster start each process with "
        "its own command (streamrl worker / learner / processor / sink)",
    ),
    "hydra": ((), "recipes compose with `defaults:` looked up next to the recipe and in its parent folders"),
    "resource": (
        (),
        "StreamRL does not schedule Kubernetes pods: size the learner with trainer.nproc_per_node "
        "and nnodes, the rollouts with rollout_worker.num_workers",
    ),
    "runtime_monitor": (
        (),
        "processes are supervised by `streamrl run` (--max-restarts, --restart-window) and a lost service ends them with exit 3",
    ),
    "algorithm.inference_service": ((), "the reference model of the KL terms is the recipe's model at step 0"),
    "data.tokenizer_path": ((), "the tokenizer is the one saved with rollout_worker.model_path"),
}


def _get(values: dict, path: str) -> tuple[bool, Any]:
    node = values
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return False, None
        node = node[part]
    return True, node


def _pop(values: dict, path: str) -> Any:
    *parents, last = path.split(".")
    node = values
    for part in parents:
        node = node[part]
    value = node.pop(last)
    if parents and node == {}:  # a section left empty by the move goes too
        _pop(values, ".".join(parents))
    return value


def _merge(into: dict, path: str, value: Any, source: str, problems: list[str]) -> None:
    *parents, last = path.split(".")
    node = into
    for part in parents:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            problems.append(f"{source}: would go to {path}, but {part} is not a mapping")
            return
    if isinstance(value, dict) and isinstance(node.get(last), dict):
        for key, item in value.items():
            _merge(into, f"{path}.{key}", item, f"{source}.{key}", problems)
    elif last in node and node[last] != value:
        problems.append(
            f"{source}: another spelling of {path}, which is also given with another value "
            f"({value!r} vs {node[last]!r}); give one"
        )
    else:
        node[last] = value


SELF_HOSTED_BACKENDS = ("self-hosted", "self_hosted", "nextrainer")


def train_service_problems(values: dict) -> list[str]:
    """The guide's `service.train_service` for a self-hosted learner (backend self-hosted
    or nextrainer, world_size) is StreamRL's own learner: world_size becomes
    trainer.nproc_per_node. A remote training API is refused with the reason."""
    found, service = _get(values, "service.train_service")
    if not found or not isinstance(service, dict) or not service:
        return []
    backend = service.get("backend")
    if backend == "none":  # StreamRL's own spelling of "no remote service" (what Recipe.to_dict writes)
        return []
    if backend == "tinker":  # a Tinker-compatible API: its learning_rate is trainer.lr (schedules apply)
        problems: list[str] = []
        config = service.get("config")
        if isinstance(config, dict) and "learning_rate" in config:
            _merge(values, "trainer.lr", config.pop("learning_rate"), "service.train_service.config.learning_rate", problems)
        return problems
    if backend not in SELF_HOSTED_BACKENDS:
        return [
            f"service.train_service.backend: {backend!r} is not supported: remote trainers speak the Tinker "
            f"API (backend: tinker, e.g. `streamrl serve-training`); the self-hosted learner "
            f"({' | '.join(SELF_HOSTED_BACKENDS)}) is StreamRL's own"
        ]
    problems = [
        f"service.train_service.{key}: not used by the self-hosted learner (StreamRL's learner runs as "
        "its own processes: streamrl learner / torchrun)"
        for key in sorted(set(service) - {"backend", "world_size"})
    ]
    if "world_size" in service:
        _merge(values, "trainer.nproc_per_node", service["world_size"], "service.train_service.world_size", problems)
    _pop(values, "service.train_service")
    return problems


def torch_data_type(values: dict) -> list[str]:
    """The guide's `type: torch` (a torch data loader over the files) reads the files by
    their extension here: jsonl or parquet."""
    problems = []
    for section in ("data", "validate.data"):
        found, data = _get(values, section)
        if not found or not isinstance(data, dict) or data.get("type") != "torch":
            continue
        kinds = {str(f).rsplit(".", 1)[-1] for f in data.get("data_files") or []}
        if len(kinds) == 1 and kinds <= {"jsonl", "parquet"}:
            data["type"] = kinds.pop()
        else:
            problems.append(
                f"{section}.type: torch reads jsonl or parquet files by their extension; "
                f"these files are {sorted(kinds) or 'none'}: name the type (jsonl or parquet)"
            )
    return problems


def no_checkpoints(values: dict) -> list[str]:
    """The guide's `save_freq: 0` ("no checkpoints") is refused with its meaning named: a
    run's snapshots are what a restart resumes from and what lets its topics rotate."""
    found, value = _get(values, "trainer.save_freq")
    if not found or value != 0:
        return []
    _pop(values, "trainer.save_freq")
    return [
        'trainer.save_freq: 0 (the guide\'s "no checkpoints") is not supported: snapshots are what a restarted '
        "learner resumes from and what lets a long run's topics rotate; a large save_freq snapshots rarely "
        "(and remove_previous_ckpt keeps only the newest)"
    ]


def apply_guide_forms(values: dict) -> list[str]:
    problems = torch_data_type(values) + no_checkpoints(values)
    for guide, (streamrl, _) in MOVED.items():
        found, value = _get(values, guide)
        if found:
            _pop(values, guide)
            _merge(values, streamrl, value, guide, problems)
    problems += train_service_problems(values)
    for key, (allowed, why) in REFUSED.items():
        found, value = _get(values, key)
        if not found:
            continue
        _pop(values, key)  # said here once, not again as an unknown key
        if not (allowed and value in allowed):  # an allowed value says what StreamRL does anyway
            problems.append(f"{key}: not supported ({why})" + (f"; only {', '.join(map(repr, allowed))}" if allowed else ""))
    return problems
