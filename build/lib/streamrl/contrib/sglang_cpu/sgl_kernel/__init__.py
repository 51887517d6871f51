"""A plain-torch stand-in for SGLang's CPU kernel package, for small dense models on CPUs.

SGLang's CPU engine imports `sgl_kernel`, whose PyPI wheel is built for CUDA only. A
managed server on `device: cpu` gets this folder on its PYTHONPATH. It implements the
one kernel the CPU engine calls for a small dense model; any other kernel raises
NotImplementedError, so a model that needs one fails loudly instead of serving wrong
outputs. GPU servers use SGLang's own sgl_kernel and never see this.
"""

import torch

__version__ = "0.0.0-streamrl-cpu"


def assign_req_to_token_pool_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """Write each request's new KV-cache slots into its row of the request-to-token table."""
    consumed = 0
    for row, start, end in zip(req_pool_indices.tolist(), start_offset.tolist(), end_offset.tolist()):
        count = end - start
        req_to_token[row, start:end] = out_cache_loc[consumed : consumed + count].to(req_to_token.dtype)
        consumed += count


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)

    def not_implemented(*args, **kwargs):
        raise NotImplementedError(f"sgl_kernel (StreamRL's CPU stand-in): {name} is not implemented; serve this model on a GPU")

    not_implemented.__name__ = name
    return not_implemented
