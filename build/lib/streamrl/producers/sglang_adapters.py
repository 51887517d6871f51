"""Weight versions as LoRA adapters on SGLang servers (`trainer.lora.versions: adapter`).

A version is a peft adapter folder (megabytes, not the model). A server loads it under
the name `v<version>` (`/load_lora_adapter`), is told that this is the version it serves
(`/update_weight_version`, so every answer's `meta_info.weight_version` is checked as for
a full load, and a server that restarted with no adapter is caught the same way), and
drops the adapter it served before. Every `/generate` then names the adapter. Managed
servers are started with LoRA on, sized from `trainer.lora`.
"""

from __future__ import annotations

from collections.abc import Callable

from streamrl.producers.sglang_server import InferenceServerError
from streamrl.runtime.device import resolve_device

ADAPTER_ROUTES = ("/load_lora_adapter", "/unload_lora_adapter", "/update_weight_version")


def adapter_name(version: int) -> str:
    return f"v{version}"


def lora_server_args(lora, device: str) -> dict:
    """Launch options of a managed server that loads `trainer.lora`'s adapters."""
    args = {
        "enable-lora": True,
        "max-lora-rank": lora.rank,
        "lora-target-modules": list(lora.target_modules),
        "max-loaded-loras": 2,
        "max-loras-per-batch": 2,
    }  # the one served and the next, while it loads
    if resolve_device(device).type == "cpu":  # the only LoRA backend without GPU kernels
        args["lora-backend"] = "torch_native"
    return args


def load_adapter(post: Callable[[str, dict], dict], url: str, version: int, folder: str, previous: str | None) -> str:
    """Load `version`'s adapter from `folder` on the server at `url` and make it the version
    it reports; unload `previous`. Returns the loaded adapter's name."""
    name = adapter_name(version)
    if previous == name:  # loaded again (a re-sync): a server that kept it must drop it first
        post("/unload_lora_adapter", {"lora_name": name})
    body = post("/load_lora_adapter", {"lora_name": name, "lora_path": folder})
    if not body.get("success"):
        raise InferenceServerError(
            f"{url} refused LoRA adapter version {version} from {folder}: "
            f"{body.get('error_message') or body.get('message') or body} (a server "
            f"started without --enable-lora, or with a smaller --max-lora-rank?)"
        )
    body = post("/update_weight_version", {"new_version": str(version), "abort_all_requests": False})
    if not body.get("success"):
        raise InferenceServerError(f"{url} loaded adapter {name} but did not take it as its weight version: {body}")
    if previous is not None and previous != name:
        post("/unload_lora_adapter", {"lora_name": previous})  # a server that restarted no longer has it
    return name
