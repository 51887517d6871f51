"""Interactions: the user (or environment) side of a multi-turn rollout.

When the assistant ends a turn without calling a tool, the agent loop asks the
interaction what happens next: a scripted user reply, a per-turn reward for the turn
just finished, and whether the episode is over. Load one from the agent config with
`interaction: {module_path: "file.py:Class", kwargs: {...}}`.

    class Feedback(Interaction):
        def respond(self, messages, task):
            if messages[-1]["content"].strip() == task["answer"]:
                return InteractionReply(done=True, reward=1.0)
            return InteractionReply(reply="Not quite, try again.", reward=0.0)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class InteractionReply:
    done: bool = False
    reply: str | None = None  # the next user turn (ignored when done)
    reward: float = 0.0  # the reward of the assistant turn just finished
    meta: dict[str, Any] | None = None


class Interaction:
    def __init__(self, **kwargs: Any):
        self.kwargs = kwargs

    def start(self, task: dict[str, Any]) -> None:
        """Called once per episode, before the first turn."""

    def respond(self, messages: list[dict[str, Any]], task: dict[str, Any]) -> InteractionReply:
        raise NotImplementedError

    def finish(self, task: dict[str, Any]) -> None:
        """Called once per episode, after the last turn, whatever ended it."""


class ScriptedUser(Interaction):
    """Plays the task's `user_turns` list in order, then ends the episode."""

    def respond(self, messages, task):
        spoken = sum(1 for m in messages if m["role"] == "user")
        script = list(task.get("user_turns") or [])
        next_index = spoken - 1  # the first user message is the task's own prompt
        if next_index >= len(script):
            return InteractionReply(done=True)
        return InteractionReply(reply=str(script[next_index]))
