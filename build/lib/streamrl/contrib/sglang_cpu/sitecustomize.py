"""Pinned host memory is a CUDA feature; on a machine without CUDA, SGLang's LoRA layers
(sglang/srt/lora/layers.py) still ask for it (`torch.tensor(..., pin_memory=True)`,
`tensor.pin_memory()`) and fail with "Found no NVIDIA driver". A managed server on
`device: cpu` gets this folder on its PYTHONPATH, so Python imports this module at start:
without CUDA, a pinned-memory request is a plain CPU tensor (which is all pinning would
give there). With CUDA it does nothing.
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
