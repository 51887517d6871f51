"""A worker's side of `weight.transport: distributed`: its SGLang servers join the
version's process group and receive the learner's broadcast (learner/weight_broadcast.py).

The worker claims its servers' ranks on the version's rendezvous store (an atomic add,
so workers need no numbering of their own) and waits for the learner to see every rank
claimed; then, on every server at once (joining the
group blocks until all of its ranks are there): `/begin_weight_update`,
`/init_weights_update_group`, `/update_weights_from_distributed` once per bucket (the
last sets the server's weight version and flushes its cache),
`/destroy_weights_update_group`, `/end_weight_update`. Any
failure raises InferenceServerError naming the server and the step; the engine then
loads the version's folder instead.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from streamrl.producers.sglang_server import InferenceServerError
from streamrl.runtime.weight_transport import GO_KEY, RANK_OFFSET_KEY, VERSION_KEY
from streamrl.schema.events import WeightBroadcast

# a rendezvous gone (its broadcast over) fails this fast; the folder is then loaded
STORE_CONNECT_TIMEOUT_S = 10.0
CACHE_NOT_FLUSHED = "cache was not flushed"


def claim_rank_offset(broadcast: WeightBroadcast, version: int, ranks: int, wait_s: float) -> int:
    """The first of `ranks` consecutive ranks of `version`'s group, claimed for this worker,
    once the learner says the group is whole (within `wait_s`)."""
    from torch.distributed import TCPStore  # here: only a worker that receives broadcasts needs torch

    try:
        store = TCPStore(
            broadcast.address,
            broadcast.port,
            is_master=False,
            wait_for_workers=False,
            timeout=datetime.timedelta(seconds=STORE_CONNECT_TIMEOUT_S),
        )
        holds = store.get(VERSION_KEY).decode()
        if holds != str(version):
            raise InferenceServerError(
                f"the rendezvous {broadcast.address}:{broadcast.port} is version {holds}'s, not {version}'s"
            )
        end = store.add(RANK_OFFSET_KEY, ranks)
        if end > broadcast.world_size:
            raise InferenceServerError(
                f"version {version}'s group has {broadcast.world_size} ranks and they are "
                f"taken (a worker that restarted during its broadcast?)"
            )
        store.wait([GO_KEY], datetime.timedelta(seconds=wait_s))
        if store.get(GO_KEY) != b"1":
            raise InferenceServerError(
                f"the learner gave up on version {version}'s broadcast: not every server "
                f"of the {broadcast.world_size - 1} ranks claimed its rank in time"
            )
    except InferenceServerError:
        raise
    except Exception as exc:  # DistNetworkError, DistStoreError: the broadcast is over (or never started)
        raise InferenceServerError(
            f"version {version}'s rendezvous {broadcast.address}:{broadcast.port} did not "
            f"answer ({type(exc).__name__}: {str(exc).splitlines()[0][:200]})"
        ) from None
    return end - ranks


def receive_broadcast(
    post: Callable[[str, str, dict], dict],
    urls: list[str],
    broadcast: WeightBroadcast,
    version: int,
    ranks_per_server: int,
    flush: Callable[[str], None],
    wait_s: float,
) -> None:
    """Every server of `urls` receives `version` from the broadcast; raises
    InferenceServerError if one did not. `post(url, route, payload)` returns the answer's
    body (a refusal's too); `flush(url)` empties a server's prefix cache."""
    first = claim_rank_offset(broadcast, version, ranks_per_server * len(urls), wait_s)
    with ThreadPoolExecutor(max_workers=len(urls), thread_name_prefix="weight-broadcast") as pool:
        futures = [
            pool.submit(_receive_on, post, url, broadcast, version, first + i * ranks_per_server, flush)
            for i, url in enumerate(urls)
        ]
        errors = [str(exc) for exc in (f.exception() for f in futures) if exc is not None]
    if errors:
        raise InferenceServerError("; ".join(errors))


def _receive_on(post, url: str, broadcast: WeightBroadcast, version: int, rank_offset: int, flush) -> None:
    def step(route: str, payload: dict) -> dict:
        body = post(url, route, payload)
        if not body.get("success", True) and CACHE_NOT_FLUSHED not in str(body.get("message")):
            raise InferenceServerError(f"{url}{route} for weight version {version}: {body.get('message', body)}")
        return body

    step("/begin_weight_update", {})
    try:
        step(
            "/init_weights_update_group",
            {
                "master_address": broadcast.address,
                "master_port": broadcast.port,
                "rank_offset": rank_offset,
                "world_size": broadcast.world_size,
                "group_name": broadcast.group_name,
                "backend": broadcast.backend,
            },
        )
        try:
            start = 0
            for index, size in enumerate(broadcast.bucket_sizes):
                last = index == len(broadcast.bucket_sizes) - 1
                part = slice(start, start + size)
                start += size
                body = step(
                    "/update_weights_from_distributed",
                    {
                        "names": broadcast.names[part],
                        "dtypes": broadcast.dtypes[part],
                        "shapes": broadcast.shapes[part],
                        "group_name": broadcast.group_name,
                        "load_format": "flattened_bucket",
                        "flush_cache": last,
                        **({"weight_version": str(version)} if last else {}),
                    },
                )
            if not body.get("success", True):  # loaded; aborted requests were still leaving the scheduler
                flush(url)
        finally:
            post(url, "/destroy_weights_update_group", {"group_name": broadcast.group_name})
    finally:
        step("/end_weight_update", {})
