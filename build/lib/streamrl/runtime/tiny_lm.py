"""A tiny causal LM and a byte-level tokenizer, built locally and saved as a normal
Hugging Face model directory.

No machine here can download weights, so built-in recipes and tests make their model
with this module and then load it back through the same code real users use
(`AutoTokenizer.from_pretrained`, `AutoModelForCausalLM.from_pretrained`).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast

from streamrl.runtime.builtin_families import BUILTIN_MODEL_VERSION, FAMILIES, STAMP_FILE, Family


def byte_alphabet() -> list[str]:
    """The 256 printable characters byte-level tokenizers spell bytes with (GPT-2's
    mapping), in byte order: the token of byte b is id b."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("\xa1"), ord("\xac") + 1), *range(ord("\xae"), ord("\xff") + 1)]
    spelled, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            spelled[byte] = chr(byte)
        else:
            spelled[byte] = chr(256 + extra)
            extra += 1
    return [spelled[b] for b in range(256)]


def build_tokenizer(family: str = "chatml") -> PreTrainedTokenizerFast:
    """A byte-level tokenizer: every byte of any text is one token (nothing is unknown,
    no whitespace is lost), plus the family's special and tag tokens and chat template."""
    spec: Family = FAMILIES[family]
    vocab = {token: i for i, token in enumerate(byte_alphabet())}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))  # no merges: one token per byte
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in spec.special_tokens])
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in spec.tag_tokens])
    if spec.add_bos and spec.bos is not None:
        bos_id = tokenizer.token_to_id(spec.bos)
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{spec.bos} $A", pair=f"{spec.bos} $A {spec.bos} $B", special_tokens=[(spec.bos, bos_id)]
        )
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token=spec.bos, eos_token=spec.eos, pad_token=spec.pad, clean_up_tokenization_spaces=False
    )
    wrapped.chat_template = spec.chat_template
    return wrapped


def tiny_config(
    tokenizer,
    family: str = "chatml",
    hidden_size: int = 128,
    layers: int = 2,
    heads: int = 4,
    max_positions: int = 128,
    **overrides,
):
    """A small config of the family's architecture, its vocabulary exactly the tokenizer's
    (SGLang samples ids beyond it otherwise)."""
    return AutoConfig.for_model(
        FAMILIES[family].model_type,
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **overrides,
    )


def build_tiny_model(directory: str | Path, seed: int = 0, family: str = "chatml", **config_overrides) -> Path:
    """Write a randomly initialised tiny model of `family`'s architecture and its tokenizer
    to `directory`, stamped with the built-in model version."""
    directory = Path(directory)
    tokenizer = build_tokenizer(family)
    config = tiny_config(tokenizer, family, **config_overrides)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    write_stamp(directory, family)
    return directory


def write_stamp(directory: Path, family: str) -> None:
    (directory / STAMP_FILE).write_text(json.dumps({"version": BUILTIN_MODEL_VERSION, "family": family}))


def load(directory: str | Path):
    """(tokenizer, model) through the ordinary loading code."""
    return AutoTokenizer.from_pretrained(directory), AutoModelForCausalLM.from_pretrained(directory)
