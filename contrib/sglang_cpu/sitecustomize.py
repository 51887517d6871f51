"""What a managed SGLang server on `device: cpu` needs changed to run well without CUDA.
Such a server gets this folder on its PYTHONPATH, so Python imports this module at start;
with CUDA it does nothing.

- Pinned host memory is a CUDA feature; SGLang's LoRA layers (sglang/srt/lora/layers.py)
  still ask for it (`torch.tensor(..., pin_memory=True)`, `tensor.pin_memory()`) and fail
  with "Found no NVIDIA driver". Here a pinned-memory request is a plain CPU tensor (which
  is all pinning would give there).
- SGLang starts its scheduler and detokenizer with multiprocessing's "spawn", which CUDA
  needs: each imports SGLang and torch again, most of a CPU server's start. Here they are
  forked from the launcher, with its imports (docs/decisions.md, 2026-12-02).
"""

import functools

import torch

if not torch.cuda.is_available():

    def _unpinned(factory):
        @functools.wraps(factory)
        def call(*args, **kwargs):
            kwargs.pop("pin_memory", None)
            return factory(*args, **kwargs)

        return call

    for _name in ("tensor", "empty", "zeros", "ones", "full", "arange"):
        setattr(torch, _name, _unpinned(getattr(torch, _name)))
    torch.Tensor.pin_memory = lambda self, *args, **kwargs: self

    import multiprocessing

    _set_start_method = multiprocessing.set_start_method

    def _fork_instead_of_spawn(method, force=False):
        _set_start_method("fork" if method == "spawn" else method, force=force)

    multiprocessing.set_start_method = _fork_instead_of_spawn
