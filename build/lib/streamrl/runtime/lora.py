"""LoRA adapters (peft), one implementation for the self-hosted learner (`trainer.lora`)
and `streamrl serve-training` (a Tinker LoRA training client).

A LoRA model is the base model with each target linear layer W given a low-rank update:
W' = W + (alpha / rank) * B @ A, with A [rank, in] and B [out, rank]; B starts at zero,
so a fresh adapter is the base model. Only A and B train. Inference engines load the
merged weights W' as an ordinary model folder (`merged_state_dict`), or SGLang the
adapter alone (`write_adapter_folder`, `trainer.lora.versions: adapter`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")
PEFT_PREFIX = "base_model.model."  # what peft puts before the base model's parameter names


@dataclass(frozen=True)
class LoraSpec:
    rank: int
    alpha: float
    dropout: float
    target_modules: tuple[str, ...]

    @property
    def scale(self) -> float:
        return self.alpha / self.rank


def lora_spec(section) -> LoraSpec | None:
    """The recipe's `trainer.lora` section as a spec (None: no adapter, full fine-tuning)."""
    if section is None:
        return None
    return LoraSpec(rank=section.rank, alpha=section.alpha, dropout=section.dropout, target_modules=tuple(section.target_modules))


def lora_targets(train_attn: bool, train_mlp: bool, train_unembed: bool) -> tuple[str, ...]:
    """The Tinker API's choice of target layers as module names."""
    return (ATTENTION if train_attn else ()) + (MLP if train_mlp else ()) + (("lm_head",) if train_unembed else ())


def untied(model):
    """The model with its own copy of the output embeddings (config says so, as saved): an
    adapter on lm_head must not change the input embeddings when merged."""
    model.lm_head.weight = torch.nn.Parameter(model.get_input_embeddings().weight.detach().clone())
    model.config.tie_word_embeddings = False
    if hasattr(model.config, "get_text_config"):
        model.config.get_text_config().tie_word_embeddings = False
    return model


def with_lora(model, spec: LoraSpec):
    """`model` (a Hugging Face causal LM) with an adapter on `spec.target_modules`; every
    other parameter is frozen."""
    from peft import LoraConfig, get_peft_model

    if "lm_head" in spec.target_modules and model.config.tie_word_embeddings:
        model = untied(model)
    config = LoraConfig(
        r=spec.rank,
        lora_alpha=spec.alpha,  # type: ignore[arg-type]  # peft scales by alpha / r: a float alpha works
        lora_dropout=spec.dropout,
        target_modules=list(spec.target_modules),
    )
    return get_peft_model(model, config)


def is_lora(model) -> bool:
    return hasattr(model, "disable_adapter") and hasattr(model, "get_base_model")


def base_of(model):
    """The Hugging Face model under a peft wrapper (itself when there is none)."""
    return model.get_base_model() if is_lora(model) else model


def merged_state_dict(state: dict[str, torch.Tensor], scale: float) -> dict[str, torch.Tensor]:
    """A LoRA model's state dict (peft's names) as the base architecture's, each adapter
    merged into its layer: W + scale * B @ A (computed in float32)."""
    merged: dict[str, torch.Tensor] = {}
    for name, value in state.items():
        if ".lora_A." in name or ".lora_B." in name:
            continue
        plain = name.removeprefix(PEFT_PREFIX).replace(".base_layer.", ".")
        if name.endswith(".base_layer.weight"):
            layer = name[: -len(".base_layer.weight")]
            down, up = state[f"{layer}.lora_A.default.weight"], state[f"{layer}.lora_B.default.weight"]
            value = (value.float() + scale * (up.float() @ down.float())).to(value.dtype)
        merged[plain] = value
    return merged


def adapter_state_dict(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A LoRA model's adapter weights under the names peft saves them by (its adapter
    name, `default`, left out), as `adapter_model.safetensors` holds them."""
    return {name.replace(".default.", "."): value for name, value in state.items() if ".lora_A." in name or ".lora_B." in name}


def write_adapter_folder(final: Path, model, state: dict[str, torch.Tensor]) -> Path:
    """The adapter of `model` (a peft model) with the weights of `state`, as a folder
    peft's `PeftModel.from_pretrained` and SGLang's `/load_lora_adapter` read; atomic."""
    from safetensors.torch import save_file

    from streamrl.runtime.folders import write_folder

    def fill(folder: Path) -> None:
        model.peft_config["default"].save_pretrained(folder)
        save_file(
            {name: value.contiguous() for name, value in adapter_state_dict(state).items()}, folder / "adapter_model.safetensors"
        )

    return write_folder(final, fill)


class AdapterDisabled:
    """The base model of a LoRA model, as a KL reference: calls run the same module with
    the adapter switched off, so the reference costs no second copy of the weights."""

    def __init__(self, model):
        self.model = model
        self.config = base_of(model).config

    def __call__(self, *args, **kwargs):
        with self.model.disable_adapter():
            return self.model(*args, **kwargs)

    def eval(self):
        return self

    def parameters(self):  # where the reference computes (its device)
        return self.model.parameters()
