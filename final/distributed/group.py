"""Where the ranks meet and how they talk: the rendezvous store and the two process groups.

The ranks meet at a `TCPStore`, torch.distributed's TCP rendezvous (what torchrun's
`--master-addr`/`--master-port` point at): rank 0 serves it, every other rank connects to it.
On one machine rank 0 serves it on a free loopback port; across machines on `--dist-init-addr
HOST:PORT`. Besides the rendezvous, the engine keeps a few keys of its own in it (the engine's
config for the other ranks, heartbeats, a failed rank's last words: runtime/ranks.py).
"""

from __future__ import annotations

import contextlib
from datetime import timedelta

import torch
import torch.distributed as dist

from ..core.errors import UserError
from .one_shot import OneShotAllReduce
from .tp import TPInfo

LOOPBACK = "127.0.0.1"
# The CPU group carries the step broadcast, which a rank waits on for as long as the engine is
# idle (hours, for a quiet server): it must not time out. Liveness is the watchdog's business.
CPU_GROUP_TIMEOUT = timedelta(days=30)
# How long the ranks wait for each other to leave the groups together (close_tp).
LEAVE_TIMEOUT = timedelta(seconds=30)


def parse_address(address: str) -> tuple[str, int]:
    """'HOST:PORT' (an IPv6 host in brackets: '[::1]:29500') -> (host, port)."""
    host, sep, port = address.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise UserError(f"--dist-init-addr takes HOST:PORT (e.g. 10.0.0.1:29500), got {address!r}")
    return host, int(port)


def open_store(
    host: str, port: int, world_size: int | None, is_server: bool, timeout_s: float
) -> dist.TCPStore:
    """Rank 0 serves the store (port 0: any free port, read back from `store.port`); every other
    rank connects to it, retrying until `timeout_s` (a node may start before node 0 does)."""
    try:
        return dist.TCPStore(
            host,
            port,
            world_size,
            is_master=is_server,
            timeout=timedelta(seconds=timeout_s),
            wait_for_workers=False,
        )
    except (RuntimeError, OSError) as err:
        where = f"{host}:{port}"
        if is_server:
            raise UserError(f"cannot serve the tensor-parallel rendezvous on {where}: {err}") from err
        raise UserError(
            f"cannot reach the tensor-parallel rendezvous at {where} (is node 0 up?): {err}"
        ) from err


def backend_for(device: torch.device) -> str:
    return "nccl" if device.type == "cuda" else "gloo"


def init_tp(
    store: dist.Store, rank: int, size: int, device: torch.device, timeout_s: float, one_shot: bool = False
) -> TPInfo:
    """Join the ranks: the device's group (NCCL on GPUs, gloo on the CPU; `timeout_s` bounds each
    collective), a gloo group on the host, and with `one_shot` the one-shot all-reduce's shared
    buffers (one_shot.py; every rank must ask alike). Blocks until every rank has called it."""
    if dist.is_initialized():
        raise UserError(
            "this process already has a torch.distributed process group (another tensor-parallel "
            "engine, or torchrun): close it first; final/ starts its own ranks"
        )
    options = {"device_id": device} if device.type == "cuda" else {}  # NCCL: connect now, not lazily
    dist.init_process_group(
        backend_for(device),
        store=store,
        rank=rank,
        world_size=size,
        timeout=timedelta(seconds=timeout_s),
        **options,
    )
    cpu_group = dist.new_group(backend="gloo", timeout=CPU_GROUP_TIMEOUT)
    fast = OneShotAllReduce(rank, size, device, cpu_group) if one_shot else None
    return TPInfo(rank=rank, size=size, group=dist.group.WORLD, cpu_group=cpu_group, one_shot=fast)


def close_tp(tp: TPInfo, abort: bool = False) -> None:
    """Leave the process groups, every rank at once. Since PyTorch 2.6, destroying an NCCL group
    flushes it with ncclCommFinalize, then ncclCommDestroy, which waits for the other ranks to
    destroy theirs (pytorch/pytorch#141510; vllm-project/vllm#39846 met the same deadlock): a rank 0
    that waits for its ranks to exit before leaving the groups waits on ranks that wait on it. So
    the ranks meet at a barrier on the host group first; gloo's teardown is local, and the barrier
    makes the CPU's teardown collective too, so the CPU tests catch a rank that leaves out of turn.
    A rank that never reaches the barrier turns the leave into an abort. `abort` after a failure:
    NCCL's communicator is aborted first, which frees a rank blocked in a collective whose peer
    is gone (destroying would wait on it)."""
    if tp.size == 1 or not dist.is_initialized():
        return
    if not abort:
        try:
            dist.monitored_barrier(group=tp.cpu_group, timeout=LEAVE_TIMEOUT)
        except RuntimeError:  # a rank did not come: leaving together would wait for it forever
            abort = True
    if not abort and tp.one_shot is not None:
        tp.one_shot.close()  # collective too: every rank is here, past the barrier
    if abort and dist.get_backend() == "nccl":
        # What vLLM does too: the group's NCCL backend, aborted alone (gloo has no abort).
        # (The watchdog may have aborted it already, to free a stuck step.)
        with contextlib.suppress(Exception):
            tp.group._get_backend(torch.device("cuda")).abort()
    dist.destroy_process_group()
