"""The learner's side of `weight.transport: distributed`: a version's tensors broadcast
from rank 0 to every SGLang server, no file in between (runtime/weight_transport.py).

Per version: `open` starts a rendezvous store on a port the OS picks and returns what the
version's announcement carries (address, port, group name, world size, and the tensors'
names, dtypes and shapes in broadcast order). The workers, on reading it, have their
servers join the group (`/init_weights_update_group`, ranks 1..) and receive
(`/update_weights_from_distributed`); `send`, on the writer thread, waits until every rank is
claimed, makes rank 0's side of the same group, broadcasts the tensors in buckets (one
flat byte buffer of consecutive tensors each, SGLang's `flattened_bucket`), and tears the
group down. A group per version
means a server that restarted is simply part of the next one. A send that fails (a
server never joined within the timeout) is logged with the reason; the folder written
after it is then how the servers get the version.
"""

from __future__ import annotations

import datetime
import logging
import time
import uuid

import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import Backend, PrefixStore, _new_process_group_helper, _world

from streamrl.runtime.weight_transport import GO_KEY, RANK_OFFSET_KEY, VERSION_KEY
from streamrl.schema.events import WeightBroadcast

log = logging.getLogger("streamrl.learner")


# a bucket's bytes: few collectives (each costs a round of messages), and a bounded
# extra copy on the sending side
BUCKET_BYTES = 256 * 2**20


def buckets(tensors: list[torch.Tensor], limit: int) -> list[int]:
    """How many consecutive tensors go in each bucket of at most `limit` bytes (a larger
    tensor alone)."""
    sizes, count, filled = [], 0, 0
    for tensor in tensors:
        nbytes = tensor.numel() * tensor.element_size()
        if count and filled + nbytes > limit:
            sizes.append(count)
            count, filled = 0, 0
        count, filled = count + 1, filled + nbytes
    return sizes + ([count] if count else [])


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


class WeightBroadcaster:
    def __init__(self, address: str, world_size: int, device: torch.device, timeout_s: float):
        self.address, self.world_size = address, world_size
        self.device = device
        self.backend = "nccl" if device.type == "cuda" else "gloo"
        self.timeout = datetime.timedelta(seconds=timeout_s)
        self._stores: dict[str, dist.TCPStore] = {}  # by group name, from open to the end of send

    def open(self, version: int, state: dict[str, torch.Tensor]) -> WeightBroadcast:
        """The rendezvous of `version`'s broadcast (listening before it is announced)."""
        store = dist.TCPStore(self.address, 0, is_master=True, wait_for_workers=False, timeout=self.timeout)
        store.set(VERSION_KEY, str(version))
        store.set(RANK_OFFSET_KEY, "1")  # rank 0 is the learner; each worker adds its servers' ranks
        names = list(state)
        manifest = WeightBroadcast(
            address=self.address,
            port=store.port,
            bucket_sizes=buckets([state[n] for n in names], BUCKET_BYTES),
            group_name=f"streamrl-v{version}-{uuid.uuid4().hex[:12]}",
            world_size=self.world_size,
            backend=self.backend,
            names=names,
            dtypes=[dtype_name(state[n].dtype) for n in names],
            shapes=[list(state[n].shape) for n in names],
        )
        self._stores[manifest.group_name] = store
        return manifest

    def _every_rank_claimed(self, store: dist.TCPStore, world_size: int) -> bool:
        deadline = time.monotonic() + self.timeout.total_seconds()
        while int(store.add(RANK_OFFSET_KEY, 0)) < world_size:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)
        return True

    def send(self, manifest: WeightBroadcast, state: dict[str, torch.Tensor]) -> bool:
        """Rank 0 of the version's group: broadcast every tensor, in the manifest's buckets.
        False (logged) when the servers did not all join or receive within the timeout.
        The group starts only once every rank is claimed (runtime/weight_transport.py)."""
        group, store = None, self._stores.pop(manifest.group_name)
        try:
            if not self._every_rank_claimed(store, manifest.world_size):
                store.set(GO_KEY, "0")
                log.warning(
                    "weight version broadcast %s: %d of %d ranks claimed in %.0f s; the servers load its folder instead",
                    manifest.group_name,
                    int(store.add(RANK_OFFSET_KEY, 0)),
                    manifest.world_size,
                    self.timeout.total_seconds(),
                )
                return False
            store.set(GO_KEY, "1")
            # the same store prefix and helper as SGLang's init_custom_process_group, so
            # both sides meet under the same keys
            group, _prefixed = _new_process_group_helper(
                manifest.world_size,
                0,
                [],
                Backend(manifest.backend),
                PrefixStore(manifest.group_name, store),
                group_name=manifest.group_name,  # type: ignore[arg-type]  # torch's GroupName is a NewType of str
                timeout=self.timeout,
            )
            # the helper registers no rank mapping for a group made outside the default
            # world, and destroy_process_group (which closes its connections) expects one
            _world.pg_group_ranks[group] = {}
            start = 0
            for size in manifest.bucket_sizes:
                names = manifest.names[start : start + size]
                start += size
                flat = torch.cat([state[n].contiguous().to(self.device).flatten().view(torch.uint8) for n in names])
                dist.broadcast(flat, group=group, group_src=0)
            return True
        except Exception as exc:  # the version's folder, written next, reaches the servers instead
            log.warning(
                "weight version broadcast %s failed (%s: %s); the servers load its folder instead",
                manifest.group_name,
                type(exc).__name__,
                exc,
            )
            return False
        finally:
            if group is not None:
                dist.destroy_process_group(group)
