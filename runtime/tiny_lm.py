"""A tiny causal LM and a character tokenizer, built locally and saved as a normal
Hugging Face model directory.

No machine here can download weights, so built-in recipes and tests make their model
with this module and then load it back through the same code real users use
(`AutoTokenizer.from_pretrained`, `AutoModelForCausalLM.from_pretrained`).
"""

from __future__ import annotations

import string
from pathlib import Path

import torch
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast, Qwen2Config

SPECIAL_TOKENS = ["<pad>", "<unk>", "<bos>", "<eos>"]
CHARACTERS = string.digits + string.ascii_letters + string.punctuation + " \n"
# The chat markers of Qwen-style chat models, for agent recipes: the turn markers are
# special tokens (skipped when decoding), the tool and thinking tags ordinary added
# tokens (kept in decoded text, so a parser can find them), as in Qwen's tokenizers.
CHAT_SPECIAL_TOKENS = ["<|im_start|>", "<|im_end|>"]
CHAT_TAG_TOKENS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"]


def build_char_tokenizer(characters: str = CHARACTERS, chat_tokens: bool = False) -> PreTrainedTokenizerFast:
    vocab = {token: i for i, token in enumerate(SPECIAL_TOKENS + sorted(set(characters)))}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    # One token per character. (`tokenizers` rejects the regex "(?s)."; [\s\S] is the same.)
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tokenizer.decoder = decoders.Fuse()
    if chat_tokens:
        tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in CHAT_SPECIAL_TOKENS])
        tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in CHAT_TAG_TOKENS])
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="<pad>", unk_token="<unk>",
                                   bos_token="<bos>", eos_token="<eos>")


def tiny_qwen2_config(vocab_size: int, hidden_size: int = 128, layers: int = 2, heads: int = 4,
                      max_positions: int = 128, **token_ids) -> Qwen2Config:
    return Qwen2Config(
        vocab_size=vocab_size,  # must equal the tokenizer's size (SGLang samples ids beyond it otherwise)
        hidden_size=hidden_size, intermediate_size=hidden_size * 2, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=heads, max_position_embeddings=max_positions,
        tie_word_embeddings=True, **token_ids,
    )


def build_tiny_model(directory: str | Path, seed: int = 0, chat_tokens: bool = False, **config_overrides) -> Path:
    """Write a randomly initialised tiny Qwen2 and its tokenizer to `directory`."""
    directory = Path(directory)
    tokenizer = build_char_tokenizer(chat_tokens=chat_tokens)
    config = tiny_qwen2_config(len(tokenizer), bos_token_id=tokenizer.bos_token_id,
                               eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                               **config_overrides)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def load(directory: str | Path):
    """(tokenizer, model) through the ordinary loading code."""
    return AutoTokenizer.from_pretrained(directory), AutoModelForCausalLM.from_pretrained(directory)
