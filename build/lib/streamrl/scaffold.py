"""`streamrl recipe new NAME [--template agent | single-turn]`: a recipe folder laid out
as the guide lays one out, that runs as soon as it is written (its set-up script makes a
tiny model and a toy data set) and that a user then edits into their task.

--template agent (the default):

    NAME/
      common.yaml               what every variant shares
      NAME.yaml                 the recipe to run: defaults [common, _self_], embedded backend
      NAME.env.sh               sourced before the recipe resolves: the ${oc.env:...} knobs
      setup.py                  makes generated/ (data, model); replace with your own
      agent_workspace/          on sys.path: these modules import each other
        agent_config.yaml       system prompt, tools, llm_config, limits
        tools.yaml, tools.py    the tool registry and the tool functions
        text_utils.py           a helper the tools and the evaluator share
        evaluator.py            the reward
        my_worker.py            a custom worker to start from (not used until named)

--template single-turn: common.yaml, NAME.yaml, NAME.env.sh, setup.py (a parquet of
chat-message prompts, as verl writes them, and a tiny model with a chat template) and
evaluator.py.
"""

from __future__ import annotations

import re
from pathlib import Path

COMMON = """\
# Shared settings of the {name} recipe; {name}.yaml composes them.
project_name: streamrl
experiment_name: {name}

environment:
  setup_script: setup.py
  env_script: {name}.env.sh

data:
  type: jsonl
  data_files: [generated/train.jsonl]
  prompt_key: prompt
  answer_key: answer

rollout_worker:
  type: agent
  agent_config_path: agent_workspace/agent_config.yaml
  agent_workspace: agent_workspace
  evaluator_module_path: agent_workspace/evaluator.py:{class_prefix}Evaluator
  model_path: generated/model
  max_response_length: 48
  rollout_repeat_n: 8
  max_concurrent_tasks: 64
  # To use your own worker instead:
  # custom_rollout_worker_module_path: agent_workspace/my_worker.py
  # custom_rollout_worker_class_name: {class_prefix}Worker

trajectory_pool:
  batch_size: 8

algorithm:
  type: grpo

trainer:
  type: grpo
  total_train_steps: ${{oc.env:{env_prefix}_STEPS,20}}
  lr: 5.0e-4
  warmup_cross_entropy_steps: ${{oc.env:{env_prefix}_WARMUP_STEPS,100}}
  warmup_messages_key: demonstration
  checkpoint_path: checkpoints

weight:
  sync_mode: fully-async
  staleness_threshold: 1
  sync_weight_path: weights

validate:
  data:
    data_files: [generated/val.jsonl]
    max_rows: 50
  eval:
    compute_interval: 10
"""

RECIPE = """\
# streamrl run {name}.yaml
defaults: [common, _self_]

service:
  inference_service:
    backend: embedded
"""

ENV = """\
# Sourced before {name}.yaml resolves; a value set by the caller wins.
export {env_prefix}_STEPS="${{{env_prefix}_STEPS:-20}}"
export {env_prefix}_WARMUP_STEPS="${{{env_prefix}_WARMUP_STEPS:-100}}"
"""

SETUP = '''\
"""Makes generated/: a toy data set (reverse a word with the `reverse` tool) and a tiny
model. Replace it with what your task needs."""

import json
import random
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "agent_workspace"))

from text_utils import reverse_text  # noqa: E402
from streamrl.api import is_current  # noqa: E402  (the model is rebuilt when stale)


def row(rng):
    word = "".join(rng.choice("abcdefgh") for _ in range(4))
    call = json.dumps({{"name": "reverse", "arguments": {{"text": word}}}}, separators=(",", ":"))
    return {{"prompt": f"reverse {{word}}", "answer": reverse_text(word), "demonstration": [
        {{"role": "user", "content": f"reverse {{word}}"}},
        {{"role": "assistant", "content": f"<tool_call>{{call}}</tool_call>"}},
        {{"role": "tool", "content": reverse_text(word)}},
        {{"role": "assistant", "content": reverse_text(word)}}]}}


def main():
    out = HERE / "generated"
    if is_current(out / "model"):
        return
    from streamrl.api import build_tiny_model  # torch only when there is a model to build

    out.mkdir(exist_ok=True)
    rng = random.Random(0)
    for name, count in (("train", 1000), ("val", 50)):
        (out / f"{{name}}.jsonl").write_text("".join(json.dumps(row(rng)) + "\\n" for _ in range(count)))
    build_tiny_model(out / "model", max_positions=256)


if __name__ == "__main__":
    main()
'''

AGENT_CONFIG = """\
system_prompt: ""
query_template: "{{prompt}}"
tools: tools.yaml
tools_in_system_prompt: false   # true: the chat template lists the tools (each family its own way)
tool_call_format: auto          # how calls are parsed: auto (from the chat template), hermes, llama3_json, mistral
llm_config:
  temperature: 1.0
  max_tokens: 48
limits:
  max_assistant_turns: 3
  max_user_turns: 0
  max_total_tokens: 200
"""

TOOLS_YAML = """\
tools:
  - callable: tools.py:reverse
    tool_schema:
      type: function
      function:
        name: reverse
        description: The text, reversed.
        parameters:
          type: object
          properties:
            text: {{type: string}}
          required: [text]
"""

TOOLS_PY = '''\
"""Tool functions: plain Python, bound to schemas in tools.yaml. Declare a `task`
parameter to receive the task's data row."""

from text_utils import reverse_text  # a neighbour in agent_workspace/


def reverse(text: str) -> str:
    return reverse_text(text)
'''

TEXT_UTILS = """\
def reverse_text(text: str) -> str:
    return text[::-1]
"""

EVALUATOR = '''\
"""The reward: 1 for the right answer. See producers/evaluator_builtins.py for built-ins
(exact match, tags, fuzzy, math, code, weighted, LLM judge)."""

from streamrl.api import EvaluationRunResult, Evaluator


class {class_prefix}Evaluator(Evaluator):
    def evaluate(self, data, evaluation_target):
        correct = float(evaluation_target.final_answer.strip() == data["answer"])
        return EvaluationRunResult(reward=correct, ground_truth=data["answer"], metrics={{"accuracy": correct}})
'''

WORKER = '''\
"""A custom worker to start from: the agent worker with its override points."""

from streamrl.api import AgentRolloutWorker


class {class_prefix}Worker(AgentRolloutWorker):
    def format_task_query(self, data_item):
        """The user message from a task's row (default: the agent config's query_template)."""
        return super().format_task_query(data_item)

    def get_train_loss_mask(self, trajectory_infos):
        """One info per LLM call (prompt_tokens, response_tokens, response_message,
        is_final, ...); return one True/False per call, or one per response token.
        By default every call's response trains."""
        return super().get_train_loss_mask(trajectory_infos)
'''


SINGLE_TURN_COMMON = """\
# Shared settings of the {name} recipe; {name}.yaml composes them.
project_name: streamrl
experiment_name: {name}

environment:
  setup_script: setup.py
  env_script: {name}.env.sh

data:
  type: parquet
  data_files: [generated/train.parquet]
  prompt_key: prompt                # chat messages (or a string), rendered with the model's chat template
  answer_key: answer                # a dotted path reaches nested columns (reward_model.ground_truth)

rollout_worker:
  type: single_turn
  evaluator_module_path: evaluator.py:{class_prefix}Evaluator   # or builtin:math, builtin:exact_match, ...
  model_path: generated/model       # your Hugging Face model folder
  max_response_length: 8
  rollout_repeat_n: 8

trajectory_pool:
  batch_size: 8

algorithm:
  type: grpo

trainer:
  type: grpo
  total_train_steps: ${{oc.env:{env_prefix}_STEPS,20}}
  lr: 5.0e-4
  warmup_cross_entropy_steps: ${{oc.env:{env_prefix}_WARMUP_STEPS,100}}   # 0 for an instruct model

weight:
  sync_mode: fully-async
  staleness_threshold: 1

validate:
  data:
    type: parquet
    data_files: [generated/val.parquet]
  eval:
    compute_interval: 10
"""

SINGLE_TURN_SETUP = '''\
"""Makes generated/: rows as verl writes them (a chat-message prompt, the answer) in
parquet, and a tiny model whose tokenizer has a ChatML chat template. Replace them with
your own data and model folder."""

import random
from pathlib import Path

HERE = Path(__file__).resolve().parent


def row(rng):
    word = "".join(rng.choice("abcdefgh") for _ in range(4))
    return {{"prompt": [{{"role": "system", "content": "Reverse the word."}}, {{"role": "user", "content": word}}],
            "answer": word[::-1]}}


def main():
    from streamrl.api import is_current

    out = HERE / "generated"
    if is_current(out / "model"):
        return
    import pyarrow as pa
    import pyarrow.parquet as pq

    from streamrl.api import build_tiny_model  # torch only when there is a model to build

    out.mkdir(exist_ok=True)
    rng = random.Random(0)
    for name, count in (("train", 1000), ("val", 50)):
        pq.write_table(pa.Table.from_pylist([row(rng) for _ in range(count)]), out / f"{{name}}.parquet")
    build_tiny_model(out / "model", max_positions=256)


if __name__ == "__main__":
    main()
'''

TEMPLATES = ("agent", "single-turn")


def scaffold_recipe(name: str, parent: Path, template: str = "agent") -> Path:
    """Write the recipe folder `parent/name`; refuses to overwrite an existing one."""
    if template not in TEMPLATES:
        raise ValueError(f"--template {template!r}: one of {', '.join(TEMPLATES)}")
    if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_]*", name):
        raise ValueError(f"recipe name {name!r}: use letters, digits and underscores, starting with a letter")
    folder = parent / name
    if folder.exists():
        raise FileExistsError(f"{folder} already exists")
    fields = {"name": name, "class_prefix": "".join(part.title() for part in name.split("_")), "env_prefix": name.upper()}
    if template == "single-turn":
        files = {
            "common.yaml": SINGLE_TURN_COMMON,
            f"{name}.yaml": RECIPE,
            f"{name}.env.sh": ENV,
            "setup.py": SINGLE_TURN_SETUP,
            "evaluator.py": EVALUATOR,
        }
    else:
        files = {
            "common.yaml": COMMON,
            f"{name}.yaml": RECIPE,
            f"{name}.env.sh": ENV,
            "setup.py": SETUP,
            "agent_workspace/agent_config.yaml": AGENT_CONFIG,
            "agent_workspace/tools.yaml": TOOLS_YAML,
            "agent_workspace/tools.py": TOOLS_PY,
            "agent_workspace/text_utils.py": TEXT_UTILS,
            "agent_workspace/evaluator.py": EVALUATOR,
            "agent_workspace/my_worker.py": WORKER,
        }
    for relative, template in files.items():
        path = folder / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(template.format(**fields))
    return folder
