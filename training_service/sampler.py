"""Sampling for `streamrl serve-training` (the API's `sample`): token-in, token-out, with
the logprob of every sampled token, from a saved sampler folder or a base model.

A plain KV-cached decoding loop over a Hugging Face model: enough for a team's own
training service to answer tinker-cookbook loops and evaluations; a recipe's rollouts
are sampled by its own inference engine (SGLang) from the same saved folders.
"""

from __future__ import annotations

from collections import OrderedDict

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer


class Sampler:
    def __init__(self, device: torch.device, cached_models: int = 2):
        self.device, self.cached_models = device, cached_models
        self._models: OrderedDict[str, tuple] = OrderedDict()

    def _load(self, folder: str):
        if folder in self._models:
            self._models.move_to_end(folder)
            return self._models[folder]
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).to(self.device).eval()
        loaded = self._models[folder] = (model, AutoTokenizer.from_pretrained(folder))
        while len(self._models) > self.cached_models:
            self._models.popitem(last=False)
        return loaded

    @torch.no_grad()
    def sample(self, folder: str, prompt: list[int], num_samples: int, params: dict,
               prompt_logprobs: bool = False) -> tuple[list[tuple[list[int], list[float], str]], list | None]:
        model, tokenizer = self._load(folder)
        max_tokens = params.get("max_tokens") or 64
        temperature = float(params.get("temperature", 1.0))
        top_k, top_p = int(params.get("top_k", -1)), float(params.get("top_p", 1.0))
        stop = params.get("stop")
        stop_ids = {tokenizer.eos_token_id} if stop is None else set()
        stop_texts: list[str] = []
        for item in ([stop] if isinstance(stop, str) else stop or []):
            (stop_ids.add(item) if isinstance(item, int) else stop_texts.append(item))
        generator = torch.Generator(device=self.device)
        generator.manual_seed(params["seed"] if params.get("seed") is not None else torch.seed() % (2 ** 63))

        tokens = torch.tensor([prompt] * num_samples, device=self.device)
        out = model(input_ids=tokens, use_cache=True)
        prompt_lp = None
        if prompt_logprobs:
            lp = torch.log_softmax(out.logits[0, :-1].float(), -1).gather(-1, tokens[0, 1:, None]).squeeze(-1)
            prompt_lp = [None] + lp.tolist()
        past, logits = out.past_key_values, out.logits[:, -1].float()
        sampled = [[] for _ in range(num_samples)]
        logprobs = [[] for _ in range(num_samples)]
        reasons = ["length"] * num_samples
        alive = torch.ones(num_samples, dtype=torch.bool, device=self.device)
        for _ in range(max_tokens):
            choice, chosen_lp = _draw(logits, temperature, top_k, top_p, generator)
            for i in torch.nonzero(alive).flatten().tolist():
                token = int(choice[i])
                sampled[i].append(token)
                logprobs[i].append(float(chosen_lp[i]))
                if token in stop_ids or (stop_texts and any(s in tokenizer.decode(sampled[i]) for s in stop_texts)):
                    alive[i], reasons[i] = False, "stop"
            if not alive.any():
                break
            out = model(input_ids=choice.unsqueeze(-1), past_key_values=past, use_cache=True)
            past, logits = out.past_key_values, out.logits[:, -1].float()
        return [(sampled[i], logprobs[i], reasons[i]) for i in range(num_samples)], prompt_lp


def _draw(logits: torch.Tensor, temperature: float, top_k: int, top_p: float, generator) -> tuple:
    """One token per row, and its logprob under the distribution it was drawn from."""
    if temperature <= 0:
        logp = torch.log_softmax(logits, -1)
        choice = logp.argmax(-1)
        return choice, logp.gather(-1, choice[:, None]).squeeze(-1)
    logits = logits / temperature
    if top_k > 0:
        kth = torch.topk(logits, min(top_k, logits.shape[-1])).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        ordered, index = torch.sort(logits, descending=True)
        cumulative = torch.softmax(ordered, -1).cumsum(-1)
        drop = cumulative - torch.softmax(ordered, -1) > top_p
        logits = logits.scatter(-1, index, ordered.masked_fill(drop, float("-inf")))
    logp = torch.log_softmax(logits, -1)
    choice = torch.multinomial(logp.exp(), 1, generator=generator).squeeze(-1)
    return choice, logp.gather(-1, choice[:, None]).squeeze(-1)
