"""The model families the built-in tokenizers imitate: their special tokens and their
chat templates, written from each format's documented structure.

    chatml   Qwen 2.5 / Qwen 3 (ChatML):  <|im_start|>role\\n...<|im_end|>\\n, tools in the
             system turn, calls as <tool_call> JSON, results as <tool_response> in a user turn
    llama3   Llama 3.1 - 3.3:  <|start_header_id|>role<|end_header_id|>\\n\\n...<|eot_id|>, tools
             in the first user turn, calls as a JSON turn, results in an ipython turn
    mistral  Mistral (v3 tokenizer):  [INST] ...[/INST]answer</s>, [AVAILABLE_TOOLS] before the
             first user turn, calls after [TOOL_CALLS], results in [TOOL_RESULTS]

Two choices differ from the published templates, both so a conversation's rendering
only ever grows at its end (what the agent loop needs): Mistral's system prompt and
tool list go with the first user turn, not the last; and no family adds a default
system prompt. Every text byte is one token (runtime/tiny_lm.py).

`BUILTIN_MODEL_VERSION` is stamped into every generated model: a recipe whose model was
made by an older version rebuilds it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

# written beside every model `streamrl model init` makes: a folder without it is someone's
# pretrained model, which the learning-rate check treats differently
INIT_MARKER = "streamrl_init.json"

BUILTIN_MODEL_VERSION = 2  # 2: byte-level tokenizers with the family's chat template
STAMP_FILE = "streamrl_builtin.json"  # {"version", "family"}: what made a generated model folder


def generated_is_current(folder: Path, settings: dict) -> bool:
    """Whether a recipe's set-up script made `folder` (data and model/) with `settings`
    and this version's model: a script returns early when it did, else it rebuilds."""
    stamp = folder / "settings.json"
    try:
        return json.loads(stamp.read_text()) == settings and is_current(folder / "model")
    except (OSError, ValueError):
        return False


def is_current(directory: str | Path) -> bool:
    """Whether `directory` holds a built-in model made by this version (a stale one is
    rebuilt by the recipe's set-up script)."""
    try:
        return json.loads((Path(directory) / STAMP_FILE).read_text()).get("version") == BUILTIN_MODEL_VERSION
    except (OSError, ValueError):
        return False


CHATML_TEMPLATE = r"""
{%- if tools %}
{{- '<|im_start|>system\n' }}
{%- if messages[0].role == 'system' %}{{- messages[0].content + '\n\n' }}{%- endif %}
{{- '# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>' }}
{%- for tool in tools %}{{- '\n' + (tool | tojson) }}{%- endfor %}
{{- '\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n' }}
{%- elif messages[0].role == 'system' %}
{{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
{%- endif %}
{%- for message in messages %}
{%- if message.role == 'system' %}
{%- if not loop.first %}{{- raise_exception('a system message may only come first') }}{%- endif %}
{%- elif message.role == 'tool' %}
{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}
{{- '\n<tool_response>\n' + message.content + '\n</tool_response>' }}
{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\n' }}{%- endif %}
{%- elif message.role == 'assistant' %}
{{- '<|im_start|>assistant\n' + (message.content or '') }}
{%- for call in message.tool_calls or [] %}
{%- set fn = call.function if call.function is defined else call %}
{{- ('\n' if (message.content or not loop.first) else '') + '<tool_call>\n{"name": "' + fn.name + '", "arguments": ' + (fn.arguments if fn.arguments is string else fn.arguments | tojson) + '}\n</tool_call>' }}
{%- endfor %}
{{- '<|im_end|>\n' }}
{%- else %}
{{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}
"""

LLAMA3_TEMPLATE = r"""
{{- bos_token }}
{%- if messages[0].role == 'system' %}
{%- set system_message = messages[0].content | trim %}{%- set loop_messages = messages[1:] %}
{%- else %}
{%- set system_message = '' %}{%- set loop_messages = messages %}
{%- endif %}
{%- if system_message or tools %}
{{- '<|start_header_id|>system<|end_header_id|>\n\n' }}
{%- if tools %}{{- 'Environment: ipython\n\n' }}{%- endif %}
{{- system_message + '<|eot_id|>' }}
{%- endif %}
{%- set state = namespace(tools_listed=false) %}
{%- for message in loop_messages %}
{%- if message.role == 'system' %}{{- raise_exception('a system message may only come first') }}
{%- elif message.role == 'user' and tools and not state.tools_listed %}
{%- set state.tools_listed = true %}
{{- '<|start_header_id|>user<|end_header_id|>\n\nGiven the following functions, please respond with a JSON for a function call with its proper arguments that best answers the given prompt.\n\nRespond in the format {"name": function name, "parameters": dictionary of argument name and its value}. Do not use variables.\n\n' }}
{%- for tool in tools %}{{- (tool | tojson(indent=4)) + '\n\n' }}{%- endfor %}
{{- message.content | trim + '<|eot_id|>' }}
{%- elif message.role == 'tool' or message.role == 'ipython' %}
{{- '<|start_header_id|>ipython<|end_header_id|>\n\n' + message.content | trim + '<|eot_id|>' }}
{%- elif message.role == 'assistant' and message.tool_calls %}
{{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- for call in message.tool_calls %}
{%- set fn = call.function if call.function is defined else call %}
{{- ('; ' if not loop.first else '') + '{"name": "' + fn.name + '", "parameters": ' + (fn.arguments if fn.arguments is string else fn.arguments | tojson) + '}' }}
{%- endfor %}
{{- '<|eot_id|>' }}
{%- else %}
{{- '<|start_header_id|>' + message.role + '<|end_header_id|>\n\n' + message.content | trim + '<|eot_id|>' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{%- endif %}
"""

MISTRAL_TEMPLATE = r"""
{{- bos_token }}
{%- if messages[0].role == 'system' %}
{%- set system_message = messages[0].content %}{%- set loop_messages = messages[1:] %}
{%- else %}
{%- set system_message = '' %}{%- set loop_messages = messages %}
{%- endif %}
{%- set state = namespace(first_user=true) %}
{%- for message in loop_messages %}
{%- if message.role == 'user' %}
{%- if state.first_user and tools %}{{- '[AVAILABLE_TOOLS] ' + (tools | tojson) + '[/AVAILABLE_TOOLS]' }}{%- endif %}
{%- if state.first_user and system_message %}{{- '[INST] ' + system_message + '\n\n' + message.content + '[/INST]' }}
{%- else %}{{- '[INST] ' + message.content + '[/INST]' }}{%- endif %}
{%- set state.first_user = false %}
{%- elif message.role == 'tool' %}
{{- '[TOOL_RESULTS] ' + ({'content': message.content} | tojson) + '[/TOOL_RESULTS]' }}
{%- elif message.role == 'assistant' and message.tool_calls %}
{{- '[TOOL_CALLS] [' }}
{%- for call in message.tool_calls %}
{%- set fn = call.function if call.function is defined else call %}
{{- (', ' if not loop.first else '') + '{"name": "' + fn.name + '", "arguments": ' + (fn.arguments if fn.arguments is string else fn.arguments | tojson) + '}' }}
{%- endfor %}
{{- ']' + eos_token }}
{%- elif message.role == 'assistant' %}
{{- message.content + eos_token }}
{%- else %}
{{- raise_exception('roles are system (first), user, assistant and tool; got ' + message.role) }}
{%- endif %}
{%- endfor %}
"""


@dataclass(frozen=True)
class Family:
    name: str
    model_type: str  # the transformers architecture its built-in models use
    special_tokens: tuple[str, ...]  # skipped when decoding for text
    tag_tokens: tuple[str, ...]  # single tokens kept in decoded text (a parser finds them)
    bos: str | None
    eos: str
    pad: str
    chat_template: str
    add_bos: bool  # the tokenizer puts BOS before raw text, as the family's do


FAMILIES: dict[str, Family] = {
    "chatml": Family(
        "chatml",
        "qwen2",
        ("<|endoftext|>", "<|im_start|>", "<|im_end|>"),
        ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"),
        bos=None,
        eos="<|im_end|>",
        pad="<|endoftext|>",
        chat_template=CHATML_TEMPLATE.strip(),
        add_bos=False,
    ),
    "llama3": Family(
        "llama3",
        "llama",
        (
            "<|begin_of_text|>",
            "<|end_of_text|>",
            "<|start_header_id|>",
            "<|end_header_id|>",
            "<|eot_id|>",
            "<|eom_id|>",
            "<|finetune_right_pad_id|>",
        ),
        ("<|python_tag|>",),
        bos="<|begin_of_text|>",
        eos="<|eot_id|>",
        pad="<|finetune_right_pad_id|>",
        chat_template=LLAMA3_TEMPLATE.strip(),
        add_bos=True,
    ),
    "mistral": Family(
        "mistral",
        "mistral",
        (
            "<unk>",
            "<s>",
            "</s>",
            "[INST]",
            "[/INST]",
            "[AVAILABLE_TOOLS]",
            "[/AVAILABLE_TOOLS]",
            "[TOOL_RESULTS]",
            "[/TOOL_RESULTS]",
        ),
        ("[TOOL_CALLS]",),
        bos="<s>",
        eos="</s>",
        pad="<unk>",
        chat_template=MISTRAL_TEMPLATE.strip(),
        add_bos=True,
    ),
}
# the family of a model_type `streamrl model init` builds
FAMILY_OF_MODEL_TYPE = {"qwen2": "chatml", "qwen3": "chatml", "llama": "llama3", "mistral": "mistral"}
