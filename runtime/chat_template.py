"""Prompts and conversation turns rendered with the model's own chat template, at the
token level.

`data.apply_chat_template` decides how a task's prompt becomes token ids:

    auto   the tokenizer's chat template when it has one (an instruct model), else the
           raw text (a pretrained-only model); a chat-message prompt needs a template
    true   the template, always (a tokenizer without one is refused)
    false  the raw text, tokenised as it is; chat-message prompts are refused

A string prompt under a template is one user message. The template gets the tool
schemas (`tools=`), so each family lists them its own way.

Multi-turn episodes keep the model's words as the ids it sampled; only what comes
between its turns is rendered. That text is found by rendering the conversation with a
placeholder for the last assistant turn and the new messages after it, with the
generation prompt, and taking what follows the placeholder: the template's close of
the assistant turn, the new messages, the next assistant header. When the sampled turn
ended with the token the template closes turns with (`<|im_end|>`, `<|eot_id|>`,
`</s>`), that token is not rendered again. So the episode's ids equal the template's
rendering of the final conversation everywhere but in the assistant turns, which are
exactly what was sampled.
"""

from __future__ import annotations

import datetime
from typing import Any, Literal

PLACEHOLDER = "\x00assistant-turn\x00"  # no template changes it, no model says it
# Tokens chat models end a turn with: the family's, where the vocabulary has one, beside EOS.
TURN_END_TOKENS = ("<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<end_of_turn>", "</s>", "<|end|>")
ChatMode = Literal["auto", "true", "false"]  # data.apply_chat_template (YAML's true/false too)
# Tokens families reserve for padding, for a tokenizer shipped without a pad token
# (Llama 3.1's `<|finetune_right_pad_id|>`, Mistral's `<pad>`), tried before EOS.
RESERVED_PAD_TOKENS = ("<|finetune_right_pad_id|>", "<pad>", "<|pad|>", "[PAD]", "<|endoftext|>")


class ChatTemplateError(ValueError):
    pass


def encode(tokenizer, text: str) -> list[int]:
    """`text`'s ids, with no special tokens added (a rendered template carries its own)."""
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def stop_token_ids(tokenizer) -> list[int]:
    """The ids that end an assistant turn: EOS and the family's turn-end tokens."""
    ids = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    for token in TURN_END_TOKENS:  # a lookup each: get_vocab() would copy a 150k-entry vocabulary per episode
        found = tokenizer.convert_tokens_to_ids(token)
        if found is not None and found != tokenizer.unk_token_id and found not in ids:
            ids.append(found)
    return ids


def padding_id(tokenizer) -> int:
    """The id that fills positions outside a sequence: the tokenizer's pad token, else a
    token its family reserves for padding, else EOS. Padded positions are outside the
    attention mask and the loss mask, so the id is never attended to, sampled or
    trained; it only has to be a valid embedding row."""
    if tokenizer.pad_token_id is not None:
        return int(tokenizer.pad_token_id)
    for token in RESERVED_PAD_TOKENS:
        found = tokenizer.convert_tokens_to_ids(token)
        if isinstance(found, int) and found != tokenizer.unk_token_id:
            return found
    eos = tokenizer.eos_token_id
    if eos is None:
        raise ValueError(f"tokenizer {tokenizer.name_or_path!r} has no pad token, no reserved pad token and no EOS to pad with")
    return int(eos)


def as_messages(prompt: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"role": "user", "content": prompt}] if isinstance(prompt, str) else [dict(m) for m in prompt]


def template_values(date: str | None) -> dict[str, Any]:
    """What a template reads from outside the conversation, pinned to `date` (ISO,
    `data.template_date`): Llama 3.x's system header calls `strftime_now` (today, by
    default) or reads `date_string`. The same date renders the same prompt in every
    process of a run, in a replay and in a re-score."""
    if not date:
        return {}
    day = datetime.date.fromisoformat(date)
    return {"strftime_now": day.strftime, "date_string": day.strftime("%d %b %Y")}


class ChatRenderer:
    """How one tokenizer turns prompts and turns into ids, under one `apply_chat_template` mode.

    `template` replaces the tokenizer's own (`data.chat_template`)."""

    def __init__(
        self,
        tokenizer,
        mode: ChatMode | bool = "auto",
        template: str | None = None,
        template_kwargs: dict[str, Any] | None = None,
        date: str | None = None,
    ):
        mode = ("true" if mode else "false") if isinstance(mode, bool) else mode
        self.tokenizer = tokenizer
        self.template_kwargs = {**template_values(date), **(template_kwargs or {})}
        self.template = template or getattr(tokenizer, "chat_template", None) or None
        if isinstance(self.template, dict):  # a tokenizer with named templates: the default one
            self.template = self.template.get("default")
        if mode == "true" and not self.template:
            raise ChatTemplateError(
                f"data.apply_chat_template is true, but the tokenizer "
                f"({getattr(tokenizer, 'name_or_path', '?')}) has no chat template "
                "(set data.chat_template, or apply_chat_template: false for raw text)"
            )
        self.templated = mode == "true" or (mode == "auto" and bool(self.template))
        self.mode = mode

    # --- prompts -----------------------------------------------------------------------
    def prompt_text(self, prompt: str | list[dict[str, Any]], tools: list[dict] | None = None) -> str:
        """The text the model is prompted with (the template's rendering, or the raw string)."""
        if not self.templated:
            if not isinstance(prompt, str):
                raise ChatTemplateError(self._why_no_template("a prompt of chat messages"))
            if tools:
                raise ChatTemplateError(self._why_no_template("tool schemas"))
            return prompt
        return self.render(as_messages(prompt), tools, add_generation_prompt=True)

    def prompt_ids(self, prompt: str | list[dict[str, Any]], tools: list[dict] | None = None) -> list[int]:
        if not self.templated:  # raw text gets the tokenizer's own special tokens (BOS), as in pretraining
            return list(self.tokenizer(self.prompt_text(prompt, tools))["input_ids"])
        return encode(self.tokenizer, self.prompt_text(prompt, tools))

    # --- turns between the model's ------------------------------------------------------
    def continuation(
        self,
        history: list[dict[str, Any]],
        new_messages: list[dict[str, Any]],
        sampled_ids: list[int],
        tools: list[dict] | None = None,
    ) -> tuple[str, list[int]]:
        """(text, ids) that follow an assistant turn: its close, `new_messages` (tool
        results, a user reply) and the next assistant header. `history` ends with that
        assistant turn; `sampled_ids` are its ids as sampled."""
        if not self.templated:
            raise ChatTemplateError(self._why_no_template("a multi-turn episode"))
        if not history or history[-1].get("role") != "assistant":
            raise ChatTemplateError("a continuation follows an assistant turn")
        conversation = [*history[:-1], {"role": "assistant", "content": PLACEHOLDER}, *new_messages]
        rendered = self.render(conversation, tools, add_generation_prompt=True)
        if rendered.count(PLACEHOLDER) != 1:
            raise ChatTemplateError("the chat template did not render the assistant turn's content once")
        after = rendered.split(PLACEHOLDER, 1)[1]
        if sampled_ids:
            closing = self.tokenizer.convert_ids_to_tokens(sampled_ids[-1])
            if closing in TURN_END_TOKENS or sampled_ids[-1] == self.tokenizer.eos_token_id:
                closing_text = self.tokenizer.decode([sampled_ids[-1]], skip_special_tokens=False)
                if after.startswith(closing_text):  # the model closed its turn itself
                    after = after[len(closing_text) :]
        return after, encode(self.tokenizer, after)

    def turn_end_id(self) -> int | None:
        """The token the template closes an assistant turn with, where it is one a model
        stops on (what a demonstration's assistant turns end with); else EOS."""
        if self.templated:
            probe = [{"role": "user", "content": "?"}, {"role": "assistant", "content": PLACEHOLDER}]
            after = encode(self.tokenizer, self.render(probe).split(PLACEHOLDER, 1)[-1])
            if after and after[0] in stop_token_ids(self.tokenizer):
                return after[0]
        return self.tokenizer.eos_token_id

    def render(self, messages: list[dict[str, Any]], tools: list[dict] | None = None, add_generation_prompt: bool = False) -> str:
        try:
            return self.tokenizer.apply_chat_template(
                messages,
                tools=tools or None,
                chat_template=self.template,
                add_generation_prompt=add_generation_prompt,
                tokenize=False,
                **self.template_kwargs,
            )
        except Exception as exc:  # jinja's errors (raise_exception in a template) are plain Exceptions
            raise ChatTemplateError(f"the chat template refused the conversation: {type(exc).__name__}: {exc}") from exc

    def _why_no_template(self, what: str) -> str:
        if self.mode == "false":
            return f"{what} needs a chat template, and data.apply_chat_template is false"
        return (
            f"{what} needs a chat template, and the tokenizer ({getattr(self.tokenizer, 'name_or_path', '?')}) "
            "has none: set data.chat_template (a .jinja file) or use a model with one"
        )


def demonstration_tokens(
    renderer: ChatRenderer,
    messages: list[dict[str, Any]],
    tools: list[dict] | None = None,
) -> tuple[list[int], list[int]]:
    """A worked episode (system/user..., then assistant, tool and user turns) laid out as
    the agent loop lays it out, with the loss mask on the assistant turns and the token
    that closes each: what a supervised warm-up trains on."""
    first_assistant = next((i for i, m in enumerate(messages) if m["role"] == "assistant"), None)
    if first_assistant is None:
        raise ValueError("a demonstration needs at least one assistant message")
    tokens = renderer.prompt_ids(messages[:first_assistant], tools)
    mask = [0] * len(tokens)
    turn_end = renderer.turn_end_id()
    history = list(messages[:first_assistant])
    pending: list[dict[str, Any]] = []
    spoken: list[int] = []
    for message in messages[first_assistant:]:
        if message["role"] != "assistant":
            pending.append(message)
            continue
        if pending:
            _, between = renderer.continuation(history, pending, spoken, tools)
            tokens, mask = tokens + between, mask + [0] * len(between)
            history += pending
            pending = []
        spoken = encode(renderer.tokenizer, message["content"]) + ([turn_end] if turn_end is not None else [])
        tokens, mask = tokens + spoken, mask + [1] * len(spoken)
        history.append(message)
    return tokens, mask


def recipe_renderer(recipe, tokenizer) -> ChatRenderer:
    """The renderer a recipe's `data.apply_chat_template` and `data.chat_template` ask for."""
    data = recipe.data
    return ChatRenderer(tokenizer, data.apply_chat_template, data.chat_template, data.chat_template_kwargs, data.template_date)
