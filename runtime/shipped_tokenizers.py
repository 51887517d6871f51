"""Hugging Face tokenizers built from the real tokenizer files PyPI packages ship, for
tests and smoke runs on machines that cannot download a model (`streamrl model
tokenizer`, then `streamrl model init --tokenizer`).

    llama3        Meta's Llama 3 BPE ranks (`llama-models`: llama3/tokenizer.model), with
                  Meta's 256 special tokens; as Llama 3.1 Instruct ships: no pad token
    mistral-nemo  Mistral NeMo's tekken vocabulary (`mistral-common`:
                  data/tekken_240718.json) through transformers' own converter, with the
                  chat template mistral-common generates for it
    qwen          Qwen's BPE ranks (`dashscope`: resources/qwen.tiktoken) and its special
                  tokens; no pad token, as the package's encoder has none

The conversions are transformers' (`convert_tiktoken_to_fast`, `convert_tekken_tokenizer`);
tests/test_shipped_tokenizers.py checks each against the package's own encoder. The
Llama 3 and Qwen packages ship no Jinja chat template: the families' templates written
here (runtime/builtin_families.py) stand in, checked against Meta's `ChatFormat`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from streamrl.runtime.builtin_families import CHATML_TEMPLATE, LLAMA3_TEMPLATE

# what to install for each (the `test` extra has them)
PACKAGE_OF = {"llama3": "llama-models", "mistral-nemo": "mistral-common", "qwen": "dashscope"}


def tiktoken_tokenizer(ranks_file: str | Path, encoding, **special: str):
    """A fast tokenizer equal to the tiktoken `encoding` whose BPE ranks `ranks_file`
    holds (transformers' converter; the special tokens follow the ranks, by id)."""
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    specials = sorted(encoding._special_tokens, key=encoding._special_tokens.get)
    converted = TikTokenConverter(vocab_file=str(ranks_file), pattern=encoding._pat_str, extra_special_tokens=specials)
    return PreTrainedTokenizerFast(tokenizer_object=converted.converted(), **special)


def llama3_tokenizer():
    import llama_models
    from llama_models.llama3.tokenizer import Tokenizer

    ranks = Path(llama_models.__file__).parent / "llama3" / "tokenizer.model"
    special = dict(bos_token="<|begin_of_text|>", eos_token="<|eot_id|>")
    tokenizer = tiktoken_tokenizer(ranks, Tokenizer(ranks).model, **special)
    tokenizer.chat_template = LLAMA3_TEMPLATE.strip()
    return tokenizer


def mistral_nemo_tokenizer():
    import mistral_common
    from transformers.integrations.mistral.tokenizer import convert_tekken_tokenizer

    return convert_tekken_tokenizer(str(Path(mistral_common.__file__).parent / "data" / "tekken_240718.json"))


def qwen_tokenizer():
    import dashscope
    from dashscope.tokenizers.qwen_tokenizer import QwenTokenizer

    ranks = Path(dashscope.__file__).parent / "resources" / "qwen.tiktoken"
    tokenizer = tiktoken_tokenizer(ranks, QwenTokenizer(str(ranks))._tokenizer, eos_token="<|im_end|>")
    tokenizer.chat_template = CHATML_TEMPLATE.strip()
    return tokenizer


SHIPPED_TOKENIZERS: dict[str, Callable] = {
    "llama3": llama3_tokenizer,
    "mistral-nemo": mistral_nemo_tokenizer,
    "qwen": qwen_tokenizer,
}


def shipped_tokenizer(name: str):
    """The tokenizer `name` names, built from its package's file."""
    if name not in SHIPPED_TOKENIZERS:
        raise ValueError(f"--name {name!r}: shipped tokenizers are {', '.join(SHIPPED_TOKENIZERS)}")
    try:
        return SHIPPED_TOKENIZERS[name]()
    except ImportError as error:
        raise ValueError(
            f"the {name} tokenizer needs the {PACKAGE_OF[name]} package (pip install 'streamrl[tokenizers]'): {error}"
        ) from error


def write_shipped_tokenizer(name: str, out: str | Path) -> Path:
    """Save the tokenizer `name` names as a Hugging Face tokenizer folder at `out`."""
    shipped_tokenizer(name).save_pretrained(out)
    return Path(out)
