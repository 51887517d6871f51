"""Real tokenizers, from the files PyPI packages ship (runtime/shipped_tokenizers.py),
checked against the packages' own encoders: Meta's Llama 3 tokenizer and `ChatFormat`
(llama-models), Mistral NeMo's tekken tokenizer and `encode_chat_completion`
(mistral-common), Qwen's BPE ranks and its encoder (dashscope). Then a few steps of
`streamrl run` on a tiny model of each family with the tokenizer as shipped (Llama's
and Qwen's without a pad token), in which no rollout fails."""

from __future__ import annotations

import functools
import json
import random
import unicodedata
from pathlib import Path

import pytest

from streamrl.runtime.chat_template import ChatRenderer
from tests.conftest import REPO, run_cli
from tests.test_byo import write_dataset

FAMILIES = ["llama3", "mistral-nemo", "qwen"]
ARCHITECTURE = {"llama3": "tiny-llama3", "mistral-nemo": "tiny-mistral", "qwen": "tiny-qwen2"}
PAD_TOKEN = {"llama3": "<|finetune_right_pad_id|>", "mistral-nemo": "<pad>", "qwen": "<|endoftext|>"}
SYSTEM = "Answer with the number only."
FIXED_TEXTS = [
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
    "How many clips did Natalia sell altogether in April and May?",
    "def f(x):\n    return x**2  # square\n\n\n",
    "  leading and trailing  ",
    "Ünïcödé — 東京 🙂 1234567 3.14159",
    "\t\ttabs\r\nCRLF",
    "48 + 24 = 72\n#### 72",
    "",
]


def random_texts(count: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    alphabet = "abcXYZ0123456789 \n\t.,;:!?'\"()[]{}<>|/\\+-*=_#@$%^&~`éü東京🙂"
    return ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 60))) for _ in range(count)]


TEXTS = FIXED_TEXTS + random_texts(300)


@pytest.fixture(scope="module")
def tokenizer_folders(tmp_path_factory) -> dict[str, Path]:
    from streamrl.runtime.shipped_tokenizers import write_shipped_tokenizer

    root = tmp_path_factory.mktemp("shipped")
    return {name: write_shipped_tokenizer(name, root / name) for name in FAMILIES}


@functools.cache
def hf(folder: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder)


@functools.cache
def llama_encoder():
    import llama_models
    from llama_models.llama3.tokenizer import Tokenizer

    return Tokenizer(Path(llama_models.__file__).parent / "llama3" / "tokenizer.model")


@functools.cache
def mistral_encoder():
    import mistral_common
    from mistral_common.tokens.tokenizers.mistral import MistralTokenizer

    return MistralTokenizer.from_file(str(Path(mistral_common.__file__).parent / "data" / "tekken_240718.json"))


@functools.cache
def qwen_encoder():
    import dashscope
    from dashscope.tokenizers.qwen_tokenizer import QwenTokenizer

    return QwenTokenizer(str(Path(dashscope.__file__).parent / "resources" / "qwen.tiktoken"))


def official_ids(family: str, text: str) -> list[int]:
    """`text`'s ids by the package's own encoder, no BOS or EOS, special-token text as text."""
    if family == "llama3":
        return llama_encoder().encode(text, bos=False, eos=False, allowed_special=set())
    if family == "mistral-nemo":
        return mistral_encoder().instruct_tokenizer.tokenizer.encode(text, bos=False, eos=False)
    return qwen_encoder().encode(text)


@pytest.mark.parametrize("family", FAMILIES)
def test_each_shipped_tokenizer_encodes_every_text_as_its_packages_encoder(family, tokenizer_folders):
    tokenizer = hf(tokenizer_folders[family])
    differing = []
    for text in TEXTS:
        expected = official_ids(family, text)
        text = unicodedata.normalize("NFC", text) if family == "qwen" else text  # Qwen's encoder normalises first
        if tokenizer(text, add_special_tokens=False)["input_ids"] != expected:
            differing.append(text)
    assert differing == [], f"{len(differing)} of {len(TEXTS)} texts encode otherwise, e.g. {differing[0]!r}"


def test_the_shipped_tokenizers_have_the_families_specials_and_llama_and_qwen_no_pad(tokenizer_folders):
    llama, mistral, qwen = (hf(tokenizer_folders[name]) for name in FAMILIES)
    assert (len(llama), llama.pad_token, llama.eos_token) == (128256, None, "<|eot_id|>")
    assert (len(mistral), mistral.eos_token) == (131072, "</s>")
    assert (len(qwen), qwen.pad_token, qwen.eos_token) == (151851, None, "<|im_end|>")


@pytest.mark.parametrize("text", [t.strip() for t in FIXED_TEXTS[:6]] + random_texts(20, seed=1))
def test_a_llama_prompt_is_metas_chat_format_id_for_id(text, tokenizer_folders):
    """Meta's ChatFormat does not trim a message; the Jinja templates (Meta's on the hub,
    and the one written here) do: the texts are compared trimmed."""
    from llama_models.datatypes import RawMessage
    from llama_models.llama3.chat_format import ChatFormat

    text = text.strip()
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": text}]
    expected = ChatFormat(llama_encoder()).encode_dialog_prompt([RawMessage(**m) for m in messages]).tokens
    assert ChatRenderer(hf(tokenizer_folders["llama3"]), "true").prompt_ids(messages) == expected


@pytest.mark.parametrize("text", FIXED_TEXTS[:6] + random_texts(20, seed=2))
def test_a_mistral_prompt_is_mistral_commons_encoding_id_for_id(text, tokenizer_folders):
    from mistral_common.protocol.instruct.messages import SystemMessage, UserMessage
    from mistral_common.protocol.instruct.request import ChatCompletionRequest

    if not text.strip():
        pytest.skip("mistral-common refuses an empty user message")
    request = ChatCompletionRequest(messages=[SystemMessage(content=SYSTEM), UserMessage(content=text)])
    expected = mistral_encoder().encode_chat_completion(request).tokens
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": text}]
    assert ChatRenderer(hf(tokenizer_folders["mistral-nemo"]), "true").prompt_ids(messages) == expected


@pytest.mark.services
@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_a_few_steps_with_each_shipped_tokenizer_as_it_ships_fail_no_rollout(
    family, tokenizer_folders, stack, ledger, run_id, tmp_path
):
    """A random tiny model of the family with the real vocabulary; what it samples is
    noise, so rewards are 0 and every group is kept (filter_zero_variance off): what is
    checked is that every rollout, validation included, is recorded without an error."""
    from streamrl.runtime.model_init import init_model

    model = init_model(ARCHITECTURE[family], tmp_path / "model", tokenizer_folder=tokenizer_folders[family], dtype="float32")
    overrides = [
        *write_dataset(tmp_path),
        f"rollout_worker.model_path={model}",
        "rollout_worker.rollout_repeat_n=2",
        "trajectory_pool.batch_size=4",
        "algorithm.filter_zero_variance=false",
        "weight.sync_mode=sync",
    ]
    env = {"BYO_STEPS": "2", "BYO_WARMUP_STEPS": "0", "BYO_RESPONSE_LENGTH": "8", "BYO_VALIDATE_EVERY": "2"}
    recipe = str(REPO / "recipes" / "byo_math" / "recipe.yaml")
    result = run_cli("run", recipe, *overrides, "--run", run_id, "--out", str(tmp_path / "out"), env=env, timeout=420)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    failures = ledger.execute(
        "select kind, count(*), min(error) from failures where run_id = %s and kind <> 'truncated response' group by kind",
        (run_id,),
    ).fetchall()
    assert failures == []
    trained, validated = ledger.execute(
        "select count(*) filter (where not is_val), count(*) filter (where is_val) from trajectories where run_id = %s",
        (run_id,),
    ).fetchone()
    assert trained >= 2 * 4 and validated >= 4, (trained, validated)
    steps = ledger.execute("select count(*) from train_steps where run_id = %s", (run_id,)).fetchone()[0]
    assert steps == 2
    started = ledger.execute(
        "select details from run_events where run_id = %s and kind = 'started' and name = 'learner'", (run_id,)
    ).fetchone()[0]
    assert started["pad_token"] == PAD_TOKEN[family]  # the pad the run chose, recorded with it


@pytest.mark.parametrize("written_id", ["abc123XYZ", None])
def test_a_mistral_tool_episode_is_mistral_commons_encoding_with_the_calls_id(written_id, tokenizer_folders):
    """The model's call carries its id (as NeMo's format writes it) or none (one is made:
    nine alphanumerics); the tool result is rendered with that id, and the episode up to
    the tool results is mistral-common's encoding of the same conversation, id for id."""
    from mistral_common.protocol.instruct.messages import AssistantMessage, ToolMessage, UserMessage
    from mistral_common.protocol.instruct.request import ChatCompletionRequest
    from mistral_common.protocol.instruct.tool_calls import Function, FunctionCall, Tool, ToolCall

    from streamrl.producers.agent_loop import AgentLimits, run_agent_loop
    from streamrl.producers.tools import ToolRegistry
    from tests.test_agent_loop import ScriptedClient

    tokenizer = hf(tokenizer_folders["mistral-nemo"])
    call = {"name": "lookup", "arguments": {"key": "ab"}} | ({"id": written_id} if written_id else {})
    turns = [tokenizer(f"[TOOL_CALLS][{json.dumps(call)}]</s>", add_special_tokens=False)["input_ids"]]
    turns.append(tokenizer("42</s>", add_special_tokens=False)["input_ids"])
    client = ScriptedClient(turns)
    client.tokenizer = tokenizer
    parameters = {"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]}
    function = {"name": "lookup", "description": "The value stored under a key.", "parameters": parameters}
    tool = {"callable": "tests.test_agent_loop:lookup", "tool_schema": {"type": "function", "function": function}}
    tools = ToolRegistry.from_config([tool], base_dir=".")  # mistral-common always lists a description
    messages = [{"role": "user", "content": "Look up ab."}]
    episode = run_agent_loop(client, messages, tools, task={"task_id": "t-1", "database": {"ab": "42"}}, limits=AgentLimits())
    assert [s.role for s in episode.segments] == ["prompt", "assistant", "tool", "assistant"]
    (used_id,) = episode.segments[2].meta["tool_call_ids"]
    assert used_id == written_id if written_id else (len(used_id) == 9 and used_id.isalnum())

    schema = tools.schemas[0]["function"]
    request = ChatCompletionRequest(
        tools=[
            Tool(function=Function(name="lookup", description=schema.get("description", ""), parameters=schema["parameters"]))
        ],
        messages=[
            UserMessage(content="Look up ab."),
            AssistantMessage(tool_calls=[ToolCall(id=used_id, function=FunctionCall(name="lookup", arguments='{"key": "ab"}'))]),
            ToolMessage(content="42", tool_call_id=used_id),
        ],
    )
    expected = mistral_encoder().encode_chat_completion(request).tokens
    prompt, _, observation = (episode.segments[i].tokens for i in range(3))
    assert prompt == expected[: len(prompt)]
    assert observation == expected[len(expected) - len(observation) :]  # [TOOL_RESULTS] with the call's id


@pytest.mark.parametrize("form", ["json", "function_tag", "python_list"])
def test_a_llama_tool_episode_is_metas_chat_format_id_for_id(form, tokenizer_folders):
    """A two-turn tool episode (the call in each of Meta's forms, then the answer): the
    model's turns are the ids Meta's ChatFormat writes for them (as sampled), and the
    whole episode, the prompt, the tool result (Meta's ipython turn) and the next
    assistant header included, is ChatFormat's encoding of the same dialog, id for id."""
    from llama_models.datatypes import RawMessage, StopReason, ToolCall, ToolPromptFormat

    from streamrl.producers.agent_loop import AgentLimits, run_agent_loop
    from streamrl.producers.tools import ToolRegistry
    from tests.test_agent_loop import ScriptedClient

    chat_format = llama_chat_format()
    call = ToolCall(call_id="c1", tool_name="lookup", arguments={"key": "ab"})
    dialog = [
        RawMessage(role="user", content="Look up ab."),
        RawMessage(role="assistant", content="", tool_calls=[call], stop_reason=StopReason.end_of_turn),
        RawMessage(role="tool", content="42"),
        RawMessage(role="assistant", content="42", stop_reason=StopReason.end_of_turn),
    ]
    encoded = [chat_format.encode_message(m, ToolPromptFormat(form))[0] for m in dialog]
    turns = [encoded[1][4:], encoded[3][4:]]  # what the model samples: after the assistant header (4 ids)
    tokenizer = hf(tokenizer_folders["llama3"])
    client = ScriptedClient(turns)
    client.tokenizer = tokenizer
    parameters = {"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]}
    function = {"name": "lookup", "description": "The value stored under a key.", "parameters": parameters}
    tools = ToolRegistry.from_config(
        [{"callable": "tests.test_agent_loop:lookup", "tool_schema": {"type": "function", "function": function}}], base_dir="."
    )
    episode = run_agent_loop(
        client,
        [{"role": "user", "content": "Look up ab."}],
        tools,
        task={"task_id": "t-1", "database": {"ab": "42"}},
        limits=AgentLimits(),
        list_tools=False,  # Meta's ChatFormat leaves the tool listing to the system prompt
    )
    assert [s.role for s in episode.segments] == ["prompt", "assistant", "tool", "assistant"]
    assert episode.tool_calls == 1 and episode.tool_errors == 0 and episode.final_answer == "42"
    expected = chat_format.encode_dialog_prompt(dialog[:3], ToolPromptFormat(form)).tokens + encoded[3][4:]
    assert episode.tokens == expected


def llama_chat_format():
    from llama_models.llama3.chat_format import ChatFormat

    return ChatFormat(llama_encoder())


@pytest.mark.parametrize("form", ["json", "function_tag", "python_list"])
def test_llamas_official_call_forms_parse_back_to_the_call(form):
    """Each form llama-models' ToolUtils writes a call in, parsed by llama3_json."""
    from llama_models.datatypes import ToolCall, ToolPromptFormat
    from llama_models.llama3.tool_utils import ToolUtils

    from streamrl.runtime.tool_call_formats import parse_llama3_json

    arguments = {"city": "Paris", "days": 3, "units": {"temp": "C"}, "tags": ["a", "b"]}
    if form == "python_list":
        arguments = {"city": "Paris", "days": 3}  # the pythonic form writes scalars only
    text = ToolUtils.encode_tool_call(ToolCall(call_id="1", tool_name="get_weather", arguments=arguments), ToolPromptFormat(form))
    prose = "" if form == "python_list" else " I will check the forecast."  # a pythonic turn is the list alone
    parsed = parse_llama3_json(text + prose)
    assert [(c.name, c.arguments) for c in parsed.tool_calls] == [("get_weather", arguments)], text
    assert parsed.errors == [] and parsed.content == prose.strip()
