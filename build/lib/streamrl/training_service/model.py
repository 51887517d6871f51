"""One trained model of `streamrl serve-training`: the base model (full fine-tuning) or
a LoRA adapter on it (peft), its AdamW state, and the API's operations on it.

forward_backward accumulates gradients (the API's losses are sums, so chunks of one
batch add up to the batch); optim_step applies them with the step's Adam parameters
and clears them. States are safetensors (the trained weights) plus the optimizer;
`export_for_sampler` writes a plain Hugging Face folder (a LoRA merged into the base), the
shape every inference engine StreamRL drives loads.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from streamrl.algos.service_losses import SERVICE_LOSSES
from streamrl.runtime.folders import write_folder
from streamrl.runtime.lora import LoraSpec, base_of, lora_targets, merged_state_dict, with_lora
from streamrl.training_service.wire import ForwardBackward

MICRO_BATCH_TOKENS = 16384  # padded tokens per forward pass


class TrainableModel:
    def __init__(self, base_model: str, lora: dict | None, seed: int | None, device: torch.device):
        self.base_model, self.lora, self.device = base_model, lora, device
        torch.manual_seed(seed or 0)  # a LoRA's initialisation is reproducible from its seed
        model = AutoModelForCausalLM.from_pretrained(base_model, dtype=torch.float32)
        self.tokenizer = AutoTokenizer.from_pretrained(base_model)
        self.spec = None
        if lora:  # the learner's LoRA (runtime/lora.py); alpha 32, as Tinker's adapters
            self.spec = LoraSpec(
                rank=lora["rank"],
                alpha=32.0,
                dropout=0.0,
                target_modules=lora_targets(
                    lora.get("train_attn", True), lora.get("train_mlp", True), lora.get("train_unembed", True)
                ),
            )
            model = with_lora(model, self.spec)
        self.model = model.to(device)  # type: ignore[arg-type]  # transformers types .to through its own wrapper
        self.params = {name: p for name, p in self.model.named_parameters() if p.requires_grad}
        self.optimizer = torch.optim.AdamW(self.params.values(), lr=1e-4)
        self.optim_steps = 0

    # --- the API's operations ------------------------------------------------------------------
    def forward_backward(self, request: ForwardBackward) -> tuple[list[dict[str, np.ndarray]], dict[str, float]]:
        """Each datum's loss (a sum over its tokens) and, unless forward-only, its gradient
        added to the accumulated ones; datums run right-padded in micro-batches of at most
        `MICRO_BATCH_TOKENS` padded tokens. Outputs: per-token `logprobs` and `elementwise_loss`."""
        loss_fn = SERVICE_LOSSES.get(request.loss_fn)
        self.model.train()
        outputs: list[dict[str, np.ndarray]] = [{} for _ in request.data]
        total = 0.0
        order = sorted(range(len(request.data)), key=lambda i: len(request.data[i].tokens))
        for group in _micro_batches(order, [len(d.tokens) for d in request.data]):
            width = max(len(request.data[i].tokens) for i in group)
            tokens = torch.zeros(len(group), width, dtype=torch.long)
            attention = torch.zeros(len(group), width, dtype=torch.long)
            targets = torch.zeros(len(group), width, dtype=torch.long)
            for row, i in enumerate(group):
                n = len(request.data[i].tokens)
                tokens[row, :n] = torch.as_tensor(request.data[i].tokens)
                targets[row, :n] = torch.as_tensor(request.data[i].inputs["target_tokens"].astype(np.int64))
                attention[row, :n] = 1
            with torch.set_grad_enabled(not request.forward_only):
                logits = self.model(
                    input_ids=tokens.to(self.device), attention_mask=attention.to(self.device), use_cache=False
                ).logits
                logprobs = torch.log_softmax(logits.float(), -1).gather(-1, targets.to(self.device)[..., None])[..., 0]
                losses = []
                for row, i in enumerate(group):
                    datum, n = request.data[i], len(request.data[i].tokens)
                    inputs = {
                        name: torch.as_tensor(value.astype(np.float32), device=self.device)
                        for name, value in datum.inputs.items()
                        if name != "target_tokens"
                    }
                    token_loss = loss_fn(logprobs[row, :n], inputs, request.loss_fn_config)
                    losses.append(token_loss.sum())
                    outputs[i] = {
                        "logprobs": logprobs[row, :n].detach().cpu().numpy(),
                        "elementwise_loss": token_loss.detach().cpu().numpy(),
                    }
                loss = torch.stack(losses).sum()
                if not request.forward_only:
                    loss.backward()
            total += float(loss.detach())
        return outputs, {"loss:sum": total}

    def optim_step(self, adam: dict) -> dict[str, float]:
        for group in self.optimizer.param_groups:
            group.update(
                lr=adam.get("learning_rate", 1e-4),
                betas=(adam.get("beta1", 0.9), adam.get("beta2", 0.95)),
                eps=adam.get("eps", 1e-12),
                weight_decay=adam.get("weight_decay", 0.0),
            )
        grads = [p.grad for p in self.params.values() if p.grad is not None]
        norm = float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))) if grads else 0.0
        if adam.get("grad_clip_norm", 0.0) > 0:
            torch.nn.utils.clip_grad_norm_(list(self.params.values()), adam["grad_clip_norm"])
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.optim_steps += 1
        return {"grad_norm": norm, "optim_steps": float(self.optim_steps)}

    # --- states ------------------------------------------------------------------------------------
    def save_state(self, folder: Path, with_optimizer: bool = True) -> Path:
        def fill(tmp: Path) -> None:
            save_file({name: p.detach().cpu().contiguous() for name, p in self.params.items()}, tmp / "trained.safetensors")
            torch.save(
                {"optimizer": self.optimizer.state_dict() if with_optimizer else None, "optim_steps": self.optim_steps},
                tmp / "optimizer.pt",
            )

        folder.parent.mkdir(parents=True, exist_ok=True)
        return write_folder(folder, fill)

    def load_state(self, folder: Path, with_optimizer: bool) -> None:
        saved = load_file(str(folder / "trained.safetensors"))
        missing = set(self.params) ^ set(saved)
        if missing:
            raise ValueError(f"the state in {folder} does not fit this model (parameters differ: {sorted(missing)[:3]})")
        with torch.no_grad():
            for name, value in saved.items():
                self.params[name].copy_(value.to(self.device))
        extra = torch.load(folder / "optimizer.pt", weights_only=False)
        if with_optimizer and extra["optimizer"] is not None:
            self.optimizer.load_state_dict(extra["optimizer"])
            self.optim_steps = extra["optim_steps"]
        else:  # the weights alone: the optimizer starts afresh (its moments belonged to other weights)
            self.optimizer = torch.optim.AdamW(self.params.values(), lr=1e-4)

    def export_for_sampler(self, folder: Path) -> Path:
        """The weights as a Hugging Face folder (a LoRA merged), written atomically."""

        def fill(tmp: Path) -> None:
            state = merged_state_dict(self.model.state_dict(), self.spec.scale) if self.spec else None
            base_of(self.model).save_pretrained(tmp, state_dict=state)
            self.tokenizer.save_pretrained(tmp)

        folder.parent.mkdir(parents=True, exist_ok=True)
        return write_folder(folder, fill)


def _micro_batches(order: list[int], lengths: list[int]) -> list[list[int]]:
    """Datums (shortest first) in groups whose padded size stays within the budget."""
    groups: list[list[int]] = [[]]
    for i in order:
        if groups[-1] and (len(groups[-1]) + 1) * lengths[i] > MICRO_BATCH_TOKENS:
            groups.append([])
        groups[-1].append(i)
    return groups
