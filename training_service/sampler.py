"""Sampling for `streamrl serve-training` (the API's `sample`): token-in, token-out, with
the logprob of every sampled token, from a saved sampler folder or a base model.

A plain KV-cached decoding loop over a Hugging Face model: enough for a team's own
training service to answer tinker-cookbook loops and evaluations; a recipe's rollouts
are sampled by its own inference engine (SGLang) from the same saved folders.
"""

from __future__ import annotations

import os
import time
from collections import OrderedDict

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from streamrl.algos.sampling import decode
from streamrl.runtime.chat_template import padding_id


class Sampler:
    def __init__(self, device: torch.device, cached_models: int = 2, max_seconds: float = 600.0):
        self.device, self.cached_models, self.max_seconds = device, cached_models, max_seconds
        self._models: OrderedDict[str, tuple] = OrderedDict()

    def _load(self, folder: str):
        """The folder's model, cached by the folder's identity as well as its name: weights
        saved again under the same name replace the folder (written atomically, a new
        directory), so the next request loads what was saved last."""
        identity = os.stat(folder)
        key = f"{folder}@{identity.st_ino}:{identity.st_mtime_ns}"
        if key in self._models:
            self._models.move_to_end(key)
            return self._models[key]
        loaded_model: torch.nn.Module = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
        model = loaded_model.to(self.device).eval()
        loaded = self._models[key] = (model, AutoTokenizer.from_pretrained(folder))
        while len(self._models) > self.cached_models:
            self._models.popitem(last=False)
        return loaded

    @torch.no_grad()
    def sample(
        self, folder: str, prompt: list[int], num_samples: int, params: dict, prompt_logprobs: bool = False
    ) -> tuple[list[tuple[list[int], list[float], str]], list | None]:
        model, tokenizer = self._load(folder)
        max_tokens = 64 if params.get("max_tokens") is None else int(params["max_tokens"])  # 0 is refused at the door
        temperature = float(params.get("temperature", 1.0))
        top_k, top_p = int(params.get("top_k", -1)), float(params.get("top_p", 1.0))
        stop = params.get("stop")
        stop_ids = {tokenizer.eos_token_id} if stop is None else set()
        stop_texts: list[str] = []
        for item in [stop] if isinstance(stop, str) else stop or []:
            (stop_ids.add(item) if isinstance(item, int) else stop_texts.append(item))
        generator = torch.Generator(device=self.device)
        generator.manual_seed(params["seed"] if params.get("seed") is not None else torch.seed() % (2**63))

        prompt_lp = None
        if prompt_logprobs:
            tokens = torch.tensor([prompt], device=self.device)
            logits = model(input_ids=tokens).logits
            lp = torch.log_softmax(logits[0, :-1].float(), -1).gather(-1, tokens[0, 1:, None]).squeeze(-1)
            prompt_lp = [None, *lp.tolist()]

        # a stop string ends at the newest token and spans at most 4 tokens a character
        # (byte-level pieces): only that tail is decoded, once a token, whatever the length
        tail = 4 * max((len(text) for text in stop_texts), default=0) + 4

        def stopped_by_text(tokens: list[int]) -> bool:
            text = tokenizer.decode(tokens[-tail:])
            return any(stop in text for stop in stop_texts)

        deadline = time.monotonic() + self.max_seconds

        def within_time() -> None:  # one request holds the shared sampler: bounded
            if time.monotonic() > deadline:
                raise ValueError(
                    f"sampling took over the service's max_sample_seconds ({self.max_seconds:g} s); "
                    "ask for fewer samples or tokens"
                )

        decoded = decode(
            model,
            [prompt] * num_samples,
            max_new_tokens=max_tokens,
            temperature=temperature,
            top_p=top_p,
            top_k=top_k,
            stop_ids=stop_ids,
            stop_text=stopped_by_text if stop_texts else None,
            pad_id=padding_id(tokenizer),
            generator=generator,
            each_step=within_time,
        )
        return [(row.tokens, row.logprobs, row.finish_reason) for row in decoded], prompt_lp
