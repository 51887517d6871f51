"""Randomly initialised models of real architectures and sizes, written as ordinary
Hugging Face folders (`streamrl model init`): nothing is downloaded, so benchmarks and
smoke tests on machines without a hub run the same loading code real checkpoints take.

The architectures are the published configs of the Qwen2 / Qwen2.5 / Qwen3 families
(hidden size, layers, heads, KV heads, MLP width, vocabulary, RoPE base, tied
embeddings), and of Llama 3.2 and Mistral 7B v0.3; `tiny-*` are small models of the same
three families for tests. The tokenizer is the project's byte-level tokenizer of the
architecture's family (runtime/builtin_families.py: its chat template and tokens); by
default the embedding keeps the architecture's full vocabulary (so the parameter count
and memory are the real ones) and the ids above the tokenizer's are never produced.
`match_tokenizer_vocab` shrinks the vocabulary to the tokenizer's size, which an
inference server that samples the whole vocabulary (SGLang) needs.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from streamrl.runtime.builtin_families import FAMILY_OF_MODEL_TYPE, INIT_MARKER
from streamrl.runtime.tiny_lm import build_tokenizer, write_stamp

ARCHITECTURES: dict[str, dict] = {
    "qwen2-0.5b": dict(
        model_type="qwen2",
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        vocab_size=151936,
        rope_theta=1000000.0,
        max_position_embeddings=32768,
        tie_word_embeddings=True,
    ),
    "qwen2-1.5b": dict(
        model_type="qwen2",
        hidden_size=1536,
        intermediate_size=8960,
        num_hidden_layers=28,
        num_attention_heads=12,
        num_key_value_heads=2,
        vocab_size=151936,
        rope_theta=1000000.0,
        max_position_embeddings=32768,
        tie_word_embeddings=True,
    ),
    "qwen2-7b": dict(
        model_type="qwen2",
        hidden_size=3584,
        intermediate_size=18944,
        num_hidden_layers=28,
        num_attention_heads=28,
        num_key_value_heads=4,
        vocab_size=152064,
        rope_theta=1000000.0,
        max_position_embeddings=32768,
        tie_word_embeddings=False,
    ),
    "qwen3-0.6b": dict(
        model_type="qwen3",
        hidden_size=1024,
        intermediate_size=3072,
        num_hidden_layers=28,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        vocab_size=151936,
        rope_theta=1000000.0,
        max_position_embeddings=40960,
        tie_word_embeddings=True,
    ),
    "llama3.2-1b": dict(
        model_type="llama",
        hidden_size=2048,
        intermediate_size=8192,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
        vocab_size=128256,
        rope_theta=500000.0,
        max_position_embeddings=131072,
        tie_word_embeddings=True,
    ),
    "mistral-7b": dict(
        model_type="mistral",
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        vocab_size=32768,
        rope_theta=1000000.0,
        max_position_embeddings=32768,
        tie_word_embeddings=False,
    ),
    # small models of the three families (tests, smoke runs)
    **{
        f"tiny-{family}": dict(
            model_type=model_type,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            vocab_size=4096,
            rope_theta=10000.0,
            max_position_embeddings=1024,
            tie_word_embeddings=True,
        )
        for family, model_type in (("qwen2", "qwen2"), ("llama3", "llama"), ("mistral", "mistral"))
    },
}


def init_model(
    architecture: str,
    out: str | Path,
    seed: int = 0,
    match_tokenizer_vocab: bool = False,
    dtype: str = "bfloat16",
    tokenizer_folder: str | Path | None = None,
) -> Path:
    """Write a randomly initialised `architecture` and its tokenizer to `out`: the
    family's byte-level tokenizer, or the Hugging Face tokenizer in `tokenizer_folder`
    as it is (its special tokens, template and pad token or none). The vocabulary grows
    to the tokenizer's when the tokenizer is larger (a tiny model with Llama 3's 128,256
    ids)."""
    if architecture not in ARCHITECTURES:
        raise ValueError(f"--config {architecture!r}: known architectures: {', '.join(ARCHITECTURES)}")
    out = Path(out)
    settings = dict(ARCHITECTURES[architecture])
    model_type = settings.pop("model_type")
    family = FAMILY_OF_MODEL_TYPE[model_type]
    tokenizer = build_tokenizer(family) if tokenizer_folder is None else AutoTokenizer.from_pretrained(tokenizer_folder)
    if match_tokenizer_vocab or len(tokenizer) > settings["vocab_size"]:
        settings["vocab_size"] = len(tokenizer)
    config = AutoConfig.for_model(
        model_type,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **settings,
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    (out / INIT_MARKER).write_text(json.dumps({"architecture": architecture, "seed": seed}))
    if tokenizer_folder is None:
        write_stamp(out, family)  # a built-in model, rebuilt by a newer version
    return out


def parameter_count(folder: str | Path) -> int:
    config = AutoConfig.from_pretrained(folder)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())
