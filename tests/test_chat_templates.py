"""Chat templates of three model families (ChatML/Qwen, Llama 3, Mistral) on `streamrl
model init` models of matching architectures: a task's prompt is the template's
rendering id for id, and a tool episode's tokens are the template's rendering of the
final conversation everywhere but in the assistant turns, which are the sampled ids."""

from __future__ import annotations

import json

import pytest
from transformers import AutoTokenizer

from streamrl.producers.agent_loop import AgentLimits, run_agent_loop
from streamrl.producers.evaluator import ExactMatchEvaluator
from streamrl.producers.inference import BatchingEngine, EmbeddedEngine, SamplingParams
from streamrl.producers.rollout import InferenceClient, SingleTurnWorker
from streamrl.producers.tools import ToolRegistry
from streamrl.runtime.chat_template import ChatRenderer, ChatTemplateError, encode
from streamrl.runtime.model_init import init_model
from streamrl.runtime.tool_call_formats import parse_hermes, parse_llama3_json, parse_mistral
from streamrl.schema.events import Task, unpack_int32, unpack_mask
from tests.test_agent_loop import ScriptedClient

FAMILIES = {"tiny-qwen2": "chatml", "tiny-llama3": "llama3", "tiny-mistral": "mistral"}
MESSAGES = [{"role": "system", "content": "Answer with a number."}, {"role": "user", "content": "What is 6 * 7?"}]
# how each family's model writes one call of lookup(key="ab")
CALLS = {
    "chatml": '<tool_call>\n{"name": "lookup", "arguments": {"key": "ab"}}\n</tool_call>',
    "llama3": '{"name": "lookup", "parameters": {"key": "ab"}}',
    "mistral": '[TOOL_CALLS] [{"name": "lookup", "arguments": {"key": "ab"}}]',
}


@pytest.fixture(scope="module", params=list(FAMILIES))
def model(request, tmp_path_factory):
    folder = init_model(
        request.param, tmp_path_factory.mktemp(request.param) / "model", match_tokenizer_vocab=True, dtype="float32"
    )
    return FAMILIES[request.param], folder, AutoTokenizer.from_pretrained(folder)


def template_ids(tokenizer, messages, **kwargs) -> list[int]:
    rendered = tokenizer.apply_chat_template(messages, tokenize=True, **kwargs)
    return list(rendered["input_ids"] if hasattr(rendered, "keys") else rendered)


def test_the_prompt_a_worker_sends_is_the_templates_rendering_id_for_id(model):
    family, folder, tokenizer = model
    engine = BatchingEngine(EmbeddedEngine(folder, seed=0))
    try:
        client = InferenceClient(engine, SamplingParams(max_new_tokens=4), chat=ChatRenderer(engine.tokenizer))
        worker = SingleTurnWorker({}, client, ExactMatchEvaluator(), lambda event: None)
        for prompt in (MESSAGES, MESSAGES[1:], "What is 6 * 7?"):
            task = Task(run_id="r", task_id="t", group_id="g", prompt=prompt, data={"answer": "42"})
            trajectory, _ = worker.run_task(task)
            sent = client.recorded()[0].prompt_token_ids
            messages = prompt if isinstance(prompt, list) else [{"role": "user", "content": prompt}]
            assert sent == template_ids(tokenizer, messages, add_generation_prompt=True), (family, prompt)
            assert unpack_int32(trajectory.tokens).tolist()[: len(sent)] == sent
            assert not unpack_mask(trajectory.loss_mask)[: len(sent)].any()
    finally:
        engine.close()


def lookup_registry() -> ToolRegistry:
    schema = {"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]}
    return ToolRegistry.from_config(
        [
            {
                "callable": "tests.test_agent_loop:lookup",
                "tool_schema": {"type": "function", "function": {"name": "lookup", "parameters": schema}},
            }
        ],
        base_dir=".",
    )


def test_a_three_turn_tool_episode_is_the_templates_rendering_around_the_sampled_turns(model):
    family, _, tokenizer = model
    stop = tokenizer.eos_token_id  # the family's turn end: <|im_end|>, <|eot_id|>, </s>
    # the model's turns, sampled byte by byte (a re-tokenising loop would change them)
    turns = [[*list(CALLS[family].encode()), stop], [*list(CALLS[family].encode()), stop], [*list(b"42"), stop]]
    client = ScriptedClient([list(t) for t in turns])
    client.tokenizer = tokenizer
    tools = lookup_registry()
    episode = run_agent_loop(
        client,
        MESSAGES,
        tools,
        task={"database": {"ab": "42"}},
        limits=AgentLimits(max_total_tokens=8000, max_tokens_per_turn=200),
    )
    assert episode.termination == "final_answer" and episode.tool_calls == 2 and episode.final_answer == "42"
    assert [s.role for s in episode.segments] == ["prompt", "assistant", "tool", "assistant", "tool", "assistant"]
    # the final conversation, each assistant turn a marker, rendered by the template
    markers = [f"\x00turn{i}\x00" for i in range(3)]
    final = [
        *MESSAGES,
        {"role": "assistant", "content": markers[0]},
        {"role": "tool", "content": "42"},
        {"role": "assistant", "content": markers[1]},
        {"role": "tool", "content": "42"},
        {"role": "assistant", "content": markers[2]},
    ]
    rendered = tokenizer.apply_chat_template(final, tools=tools.schemas, tokenize=False)
    pieces, rest = [], rendered
    for marker in markers:
        before, rest = rest.split(marker)
        pieces.append(before)
    closing = tokenizer.decode([stop])  # the model said it: it opens the next piece in the rendering
    between = [pieces[0]] + [p.removeprefix(closing) for p in pieces[1:]]
    assert rest.removeprefix(closing).strip() == ""  # nothing follows the last turn but its close
    segments = episode.segments
    assert [segments[i].tokens for i in (0, 2, 4)] == [encode(tokenizer, text) for text in between]
    assert [segments[i].tokens for i in (1, 3, 5)] == turns
    mask = [int(s.sampled) for s in segments for _ in s.tokens]
    assert mask == [0] * len(segments[0].tokens) + [1] * len(turns[0]) + [0] * len(segments[2].tokens) + [1] * len(turns[1]) + [
        0
    ] * len(segments[4].tokens) + [1] * len(turns[2])


def test_each_family_parses_its_own_calls_and_reports_malformed_ones():
    assert [(c.name, c.arguments) for c in parse_hermes(CALLS["chatml"]).tool_calls] == [("lookup", {"key": "ab"})]
    two = parse_llama3_json('<|python_tag|>{"name": "a", "parameters": {"x": 1}}; {"name": "b", "parameters": {}}')
    assert [(c.name, c.arguments) for c in two.tool_calls] == [("a", {"x": 1}), ("b", {})]
    assert parse_llama3_json("The answer is 42.").content == "The answer is 42."
    assert "not valid JSON" in parse_llama3_json('{"name": "a", "parameters": ').errors[0]
    mistral = parse_mistral('[TOOL_CALLS] [{"name": "a", "arguments": {"k": "v"}}, {"name": "b", "arguments": {}}]</s>')
    assert [(c.name, c.arguments) for c in mistral.tool_calls] == [("a", {"k": "v"}), ("b", {})]
    assert "JSON list" in parse_mistral('[TOOL_CALLS] {"name": "a"}').errors[0]


def test_raw_text_mode_refuses_chat_messages_and_true_mode_needs_a_template(model):
    _, _, tokenizer = model
    raw = ChatRenderer(tokenizer, False)
    assert raw.prompt_ids("6*7=") == list(tokenizer("6*7=")["input_ids"])  # the tokenizer's own BOS, if any
    with pytest.raises(ChatTemplateError, match="apply_chat_template is false"):
        raw.prompt_ids(MESSAGES)
    tokenizer_without = AutoTokenizer.from_pretrained(tokenizer.name_or_path)
    tokenizer_without.chat_template = None
    with pytest.raises(ChatTemplateError, match="has no chat template"):
        ChatRenderer(tokenizer_without, True)
    assert ChatRenderer(tokenizer_without, "auto").prompt_ids("6*7=") == raw.prompt_ids("6*7=")
    custom = "{% for m in messages %}<<{{ m.content }}>>{% endfor %}"
    assert ChatRenderer(tokenizer, "auto", custom).prompt_text(MESSAGES) == "<<Answer with a number.>><<What is 6 * 7?>>"


def test_every_byte_survives_encode_and_decode(model):
    _, _, tokenizer = model
    text = '  tabs\tand\r\nnewlines\n\n, ünïcödé 漢字 🙂 \x00\x7f <tool_call>{"k": [1, 2]}</tool_call>  '
    assert tokenizer.decode(encode(tokenizer, text)) == text
    assert json.loads(json.dumps(text)) == text


def word_tokenizer(words: list[str], **special: str):
    """A word-level tokenizer over `words`, with only the special tokens given."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    vocabulary = {word: index for index, word in enumerate(words)}
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(vocabulary)), **special)


def test_a_tokenizer_without_a_pad_token_pads_with_its_reserved_pad_else_eos():
    from streamrl.runtime.chat_template import padding_id

    words = ["a", "b", "<|finetune_right_pad_id|>", "<|eot_id|>", "<|end_of_text|>"]
    assert padding_id(word_tokenizer(words, pad_token="b", eos_token="<|eot_id|>")) == 1
    # Llama 3.1 Instruct as shipped: no pad token, a reserved one in the vocabulary
    assert padding_id(word_tokenizer(words, eos_token="<|eot_id|>")) == 2
    assert padding_id(word_tokenizer(["a", "b", "</s>"], eos_token="</s>")) == 2
    with pytest.raises(ValueError, match="no pad token, no reserved pad token and no EOS"):
        padding_id(word_tokenizer(["a", "b"]))


def test_a_closing_tag_inside_a_string_argument_does_not_end_a_hermes_call():
    text = '<tool_call>{"name": "echo", "arguments": {"text": "a </tool_call> b"}}</tool_call> done'
    parsed = parse_hermes(text)
    assert [(c.name, c.arguments) for c in parsed.tool_calls] == [("echo", {"text": "a </tool_call> b"})]
    assert parsed.errors == [] and parsed.content == "done"
    unclosed = parse_hermes('before <tool_call>{"name": "echo", "arguments": {}}')
    assert unclosed.errors == ["a <tool_call> was not closed with </tool_call>"] and unclosed.content == "before"


def test_prose_after_a_llama_json_call_is_the_turns_content_not_an_error():
    parsed = parse_llama3_json('{"name": "get", "parameters": {"key": "a"}} Let me look that up.')
    assert [(c.name, c.arguments) for c in parsed.tool_calls] == [("get", {"key": "a"})]
    assert parsed.errors == [] and parsed.content == "Let me look that up."
    assert parse_llama3_json("[1, 2]").content == "[1, 2]"  # a list that is not calls is an answer
