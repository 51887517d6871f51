"""The guide's worker types and customisation patterns, as working workers on this
project's API. Each is a starting point to copy into a recipe's agent_workspace/ and
name with custom_rollout_worker_module_path / custom_rollout_worker_class_name; the
rollout_worker keys they read (few_shot, api_url, marker, ...) go in the same section.

    SimpleQAWorker        type 1: format, call, extract, score, one trajectory
    MultiStepWorker       type 3: reasoning call, then an answer call that continues the
                          same token sequence; the loss mask trains only the answer
    FewShotTemplateWorker pattern 1: system prompt and few-shot examples from the config
    ExternalContextWorker pattern 2: fetch context from an HTTP API before prompting
    MarkerMaskWorker      pattern 3: train only the response tokens after a marker
    ConditionalEvalWorker pattern 4: the task's `type` picks the evaluator

The agent worker (type 2: agent config, tools, tracer) is producers/agent_worker.py.
"""

from __future__ import annotations

import json
import re
import urllib.parse
import urllib.request
from typing import ClassVar

from streamrl.api import BaseEvaluationTarget, BaseRolloutWorker, Trajectory, make_evaluator, run_evaluator, token_loss_mask


def _trajectory(result: dict, reward: float, task: dict, mask: list[int] | None = None, **extra) -> Trajectory:
    prompt, response = result["prompt_tokens"], result["response_tokens"]
    return Trajectory(
        tokens=prompt + response,
        loss_mask=mask or [0] * len(prompt) + [1] * len(response),
        reward=reward,
        is_val=task.get("is_val", False),
        extra_fields={"response": result["response"], "ground_truth": task.get("answer", ""), **extra},
    )


class SimpleQAWorker(BaseRolloutWorker):
    def rollout(self, task):
        if "question" not in task:
            return "fail"  # recorded with its error; the task's group still completes
        result = self._inference_client.completion(f"Q: {task['question']}\nA:")
        answer = self._extract_answer(result["response"])
        reward = float(answer == str(task.get("answer", "")).strip())
        return self._put_trajectory(_trajectory(result, reward, task, extracted_answer=answer))

    def _extract_answer(self, response: str) -> str:
        match = re.search(r"<answer>(.*?)</answer>", response, re.DOTALL)
        return (match.group(1) if match else response).strip()


class MultiStepWorker(BaseRolloutWorker):
    """Two calls, one trajectory. Unlike the guide's sketch, the answer call is given
    the first call's prompt and response as token ids (plus a separator), so the merged
    trajectory is exactly the sequence the answer was sampled from: the learner's ratio
    then compares the same context, not a re-worded one."""

    separator = "\nAnswer:"

    def rollout(self, task):
        reasoning = self._inference_client.completion(
            f"Think about: {task['prompt']}\n", max_tokens=self._config.get("reasoning_tokens", 16)
        )
        tokenizer = self._inference_client.tokenizer
        context = (
            reasoning["prompt_tokens"]
            + reasoning["response_tokens"]
            + tokenizer(self.separator, add_special_tokens=False)["input_ids"]
        )
        answer = self._inference_client.completion(context, max_tokens=self._config.get("answer_tokens", 8))
        tokens = answer["prompt_tokens"] + answer["response_tokens"]
        mask = [0] * len(answer["prompt_tokens"]) + [1] * len(answer["response_tokens"])  # only the answer trains
        reward = float(answer["response"].strip() == str(task.get("answer", "")).strip())
        return self._put_trajectory(
            Trajectory(
                tokens=tokens,
                loss_mask=mask,
                reward=reward,
                is_val=task.get("is_val", False),
                extra_fields={"reasoning": reasoning["response"], "response": answer["response"]},
            )
        )


class FewShotTemplateWorker(BaseRolloutWorker):
    """rollout_worker.system_prompt and rollout_worker.few_shot: [{question, answer}, ...]."""

    def _build_prompt(self, task) -> str:
        parts = [self._config.get("system_prompt", "")]
        parts += [f"Q: {ex['question']}\nA: {ex['answer']}" for ex in self._config.get("few_shot", [])]
        parts.append(f"Q: {task['prompt']}\nA:")
        return "\n".join(p for p in parts if p)

    def rollout(self, task):
        result = self._inference_client.completion(self._build_prompt(task))
        outcome = run_evaluator(self.evaluator, task.get("data", {}), BaseEvaluationTarget(result["response"]))
        return self._put_trajectory(_trajectory(result, outcome.result.reward, task))


class ExternalContextWorker(BaseRolloutWorker):
    """Asks rollout_worker.api_url (GET ?q=...) for context, then prompts with it; an
    unreachable API fails the rollout, which is recorded and retried, not lost."""

    def rollout(self, task):
        url = f"{self._config['api_url']}?{urllib.parse.urlencode({'q': task['prompt']})}"
        with urllib.request.urlopen(url, timeout=self._config.get("api_timeout_s", 5)) as reply:
            context = json.loads(reply.read())["context"]
        result = self._inference_client.completion(f"Context: {context}\nQ: {task['prompt']}\nA:")
        outcome = run_evaluator(self.evaluator, task.get("data", {}), BaseEvaluationTarget(result["response"]))
        return self._put_trajectory(_trajectory(result, outcome.result.reward, task, context=context))


class MarkerMaskWorker(BaseRolloutWorker):
    """Trains only what follows rollout_worker.marker in the response (all of it when the
    marker is absent), matched on token ids: the guide's pattern 3, one mask value per
    response token of each LLM call."""

    def get_train_loss_mask(self, trajectory_infos):
        marker = self.tokenizer(self._config.get("marker", "="), add_special_tokens=False)["input_ids"]
        mask = []
        for info in trajectory_infos:
            response = info["response_tokens"]
            start = next(
                (i + len(marker) for i in range(len(response) - len(marker) + 1) if response[i : i + len(marker)] == marker), 0
            )
            mask += [False] * start + [True] * (len(response) - start)
        return mask

    def rollout(self, task):
        result = self._inference_client.completion(task["prompt"])
        info = {"response_tokens": result["response_tokens"], "start": len(result["prompt_tokens"])}
        tokens = result["prompt_tokens"] + result["response_tokens"]
        mask = token_loss_mask(self.get_train_loss_mask([info]), [info], len(tokens))
        reward = float(result["response"].strip().endswith(str(task.get("answer", ""))))
        return self._put_trajectory(_trajectory(result, reward, task, mask=mask))


class ConditionalEvalWorker(BaseRolloutWorker):
    """The task's `type` chooses how the response is scored: exact, contains or similarity."""

    SCORERS: ClassVar[dict] = {"exact": make_evaluator("builtin:exact_match"), "similarity": make_evaluator("builtin:fuzzy")}

    def rollout(self, task):
        result = self._inference_client.completion(task["prompt"])
        kind = task.get("type", "exact")
        if kind == "contains":
            reward = float(str(task.get("answer", "")) in result["response"])
        elif kind in self.SCORERS:
            reward = run_evaluator(
                self.SCORERS[kind], task.get("data", {}), BaseEvaluationTarget(result["response"])
            ).result.reward
        else:
            reward = 0.0  # an unknown type scores nothing, and says so
        return self._put_trajectory(_trajectory(result, reward, task, task_type=kind))
