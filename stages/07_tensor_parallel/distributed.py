"""Tensor parallelism's arithmetic and wiring: which rank this process is, how each weight splits over
the ranks, and how the ranks talk.

A `TPInfo` says which rank this process is among how many, and carries the process groups. It is
passed to whatever needs it (the layers, the runner), never kept in a global. With one rank
(`TPInfo()`) every share is the whole and every collective does nothing, so `--tp 1` runs the
code of stage 06.

Two process groups join the ranks:

    group       the device's: NCCL between GPUs, gloo on the CPU. The model's collectives (an
                all-reduce after each row-parallel matmul and after the embedding, an all-gather
                of the logits) and the broadcast of each step's sampled tokens.
    cpu_group   gloo, on the host: rank 0 sends each step's batch over it (`StepMessage`), and
                the ranks agree on start-up numbers (the KV pool's size) through it.

The ranks meet at a TCPStore (torch.distributed's TCP rendezvous, what torchrun's --master-addr
and --master-port name), which rank 0 serves (ranks.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from stages.common.errors import UserError
from stages.common.model_config import ModelConfig

from .request import Batch

# The CPU group carries the step broadcast, on which the other ranks wait for as long as the engine
# is idle: it must not time out. A lost rank is the watchdog's business (ranks.py).
CPU_GROUP_TIMEOUT = timedelta(days=30)
LEAVE_TIMEOUT = timedelta(seconds=30)  # how long the ranks wait for each other to leave together


# --8<-- [start:tpinfo]
@dataclass(frozen=True)
class TPInfo:
    rank: int = 0
    size: int = 1
    group: Any = None  # the device's process group, when size > 1
    cpu_group: Any = None  # a gloo group on the host, when size > 1

    @property
    def is_first(self) -> bool:
        return self.rank == 0

    def split(self, total: int, what: str = "features") -> int:
        """This rank's share of `total`, which must divide evenly."""
        if total % self.size:
            raise UserError(f"{total} {what} do not split over {self.size} tensor-parallel ranks")
        return total // self.size

    def shard(self, total: int, what: str = "features") -> tuple[int, int]:
        """(start, length) of this rank's slice of a dimension of size `total`."""
        length = self.split(total, what)
        return self.rank * length, length

    def kv_head_shard(self, num_kv_heads: int) -> tuple[int, int]:
        """(first head, count) of the KV heads this rank holds. Query head h reads KV head
        h // (heads / kv_heads), so a rank holding a slice of the query heads needs the matching
        slice of the KV heads. With fewer KV heads than ranks, size / kv_heads consecutive ranks
        hold the same one: the head their query heads read (it is replicated)."""
        if num_kv_heads >= self.size:
            return self.shard(num_kv_heads, "KV heads")
        return self.rank * num_kv_heads // self.size, 1

    def padded_vocab(self, vocab_size: int) -> int:
        """The vocabulary rounded up to a multiple of the ranks, so that each holds as many rows."""
        return -(-vocab_size // self.size) * self.size

    def local_config(self, config: ModelConfig) -> ModelConfig:
        """The model as this rank's attention sees it: its own heads. The KV pool and the attention
        backends are built from this, and need no other change."""
        _, kv_heads = self.kv_head_shard(config.num_kv_heads)
        heads = self.split(config.num_heads, "attention heads")
        return dataclasses.replace(config, num_heads=heads, num_kv_heads=kv_heads)

    # --8<-- [end:tpinfo]

    # --8<-- [start:collectives]
    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum `x` over the ranks, in place."""
        if self.size > 1:
            dist.all_reduce(x, group=self.group)
        return x

    def all_gather(self, x: torch.Tensor) -> torch.Tensor:
        """Every rank's `x` [rows, n] side by side: [rows, size * n], rank r's in columns r * n...
        One collective into one buffer, stacking the ranks' blocks on top of each other, then the
        blocks moved side by side."""
        if self.size == 1:
            return x
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor  # renamed in 2.13
        stacked = torch.empty((self.size * x.shape[0], x.shape[1]), dtype=x.dtype, device=x.device)
        gather(stacked, x.contiguous(), group=self.group)
        return stacked.view(self.size, *x.shape).transpose(0, 1).reshape(x.shape[0], -1)

    def broadcast(self, x: torch.Tensor) -> torch.Tensor:
        """Rank 0's `x` on every rank, in place (on a GPU: queued, the host does not wait)."""
        if self.size > 1:
            dist.broadcast(x, src=0, group=self.group)
        return x

    # --8<-- [end:collectives]

    def min_over_ranks(self, value: int) -> int:
        """The smallest of every rank's `value`: each rank measures its own free memory, but all
        build a KV pool of the same size, since rank 0's page ids index every rank's pool."""
        if self.size == 1:
            return value
        t = torch.tensor([value], dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self.cpu_group)
        return int(t.item())

    def barrier(self) -> None:
        """Wait on the host until every rank gets here (the CPU group does not time out: a rank
        that reads its weights minutes later than another does not trip the device group's)."""
        if self.size > 1:
            dist.barrier(group=self.cpu_group)

    # --8<-- [start:send]
    def send_step(self, message: StepMessage | None) -> None:
        """Rank 0: the next step for every other rank (None: shut down)."""
        dist.broadcast_object_list([message], src=0, group=self.cpu_group)

    def receive_step(self) -> StepMessage | None:
        """The other ranks: wait for rank 0's next step."""
        box: list[StepMessage | None] = [None]
        dist.broadcast_object_list(box, src=0, group=self.cpu_group)
        return box[0]

    # --8<-- [end:send]


def check_degree(config: ModelConfig, size: int) -> None:
    """A UserError unless `size` ranks can share the model: its query heads and its MLP split
    evenly, its KV heads split evenly or replicate evenly. The vocabulary needs nothing: it is
    padded to a multiple of the ranks."""
    if size < 1:
        raise UserError(f"--tp must be >= 1, got {size}")
    kv = config.num_kv_heads
    problems = []
    if config.num_heads % size:
        problems.append(f"its {config.num_heads} attention heads")
    if config.intermediate_size % size:
        problems.append(f"its MLP's {config.intermediate_size} features")
    if (kv % size if kv >= size else size % kv) != 0:  # split evenly, or replicate evenly
        problems.append(f"its {kv} KV heads (split, or replicated when --tp is a multiple of them)")
    if problems:
        raise UserError(
            f"--tp {size} cannot shard {config.architecture}: {' and '.join(problems)} do not divide "
            f"over {size} ranks; choose a degree that divides them"
        )


# --8<-- [start:message]
@dataclass
class StepMessage:
    """One step as the other ranks need it: rank 0's batch, request for request in rank 0's order,
    and the page-table writes rank 0's scheduler made since the last step (every rank keeps its
    own copy of the page table on its device). Rank 0 alone knows the requests; the others get
    their rows and lengths, and the input tokens the host knows."""

    page_writes: list[tuple[int, int, list[int]]]  # (row, first column, pages)
    is_prefill: bool
    rows: list[int]
    starts: list[int]  # the request's tokens computed before this step: its first position here
    query_lens: list[int]
    sampled: list[bool]
    pending: list[bool]  # its input is the token in flight, which the token table holds
    known_ids: list[list[int]]  # the input tokens the host knows (none for a pending one)

    @classmethod
    def of(cls, batch: Batch, page_writes: list[tuple[int, int, list[int]]]) -> StepMessage:
        reqs, lens = batch.requests, batch.query_lens
        known = [
            [] if r.num_pending else r.tokens(r.num_computed, r.num_computed + n)
            for r, n in zip(reqs, lens, strict=True)
        ]
        return cls(
            page_writes, batch.is_prefill, [r.row for r in reqs], [r.num_computed for r in reqs], list(lens),
            list(batch.sampled), [r.num_pending > 0 for r in reqs], known,
        )  # fmt: skip

    def batch(self) -> Batch:
        """The batch rank 0 runs, rebuilt from what the runner reads of it."""
        requests = [
            StepRequest(row, start, int(pending), ids)
            for row, start, pending, ids in zip(
                self.rows, self.starts, self.pending, self.known_ids, strict=True
            )
        ]
        seq_lens = [start + n for start, n in zip(self.starts, self.query_lens, strict=True)]
        return Batch(requests, self.is_prefill, list(self.query_lens), seq_lens, list(self.sampled))  # type: ignore[arg-type]

    @property
    def sampled_rows(self) -> list[int]:
        return [row for row, sampled in zip(self.rows, self.sampled, strict=True) if sampled]


@dataclass
class StepRequest:
    """A request as a rank other than 0 sees it: what `ModelRunner.prepare` and the graph replay
    read of a `Request`."""

    row: int
    num_computed: int
    num_pending: int
    known_ids: list[int]

    def tokens(self, start: int, end: int) -> list[int]:
        return self.known_ids[start - self.num_computed : end - self.num_computed]


# --8<-- [end:message]


# --8<-- [start:groups]
def init_groups(store: dist.Store, rank: int, size: int, device: torch.device, timeout_s: float) -> TPInfo:
    """Join the ranks (every rank calls this; it returns once all have): the device's group, whose
    collectives time out after `timeout_s`, and a gloo group on the host."""
    backend, options = ("nccl", {"device_id": device}) if device.type == "cuda" else ("gloo", {})
    dist.init_process_group(
        backend, store=store, rank=rank, world_size=size, timeout=timedelta(seconds=timeout_s), **options
    )
    cpu_group = dist.new_group(backend="gloo", timeout=CPU_GROUP_TIMEOUT)
    return TPInfo(rank, size, dist.group.WORLD, cpu_group)


# --8<-- [end:groups]


def close_groups(tp: TPInfo, together: bool = True) -> None:
    """Leave the process groups. Destroying an NCCL group waits for the other ranks to destroy
    theirs (PyTorch 2.6 on: ncclCommFinalize, then ncclCommDestroy), so every rank leaves at the
    same moment: they meet at a barrier on the host group first. Gloo's teardown is local; the
    barrier makes the CPU's collective too, so the CPU tests catch a rank that leaves out of turn.
    `together=False` after a failure, when the others will not come."""
    if tp.size == 1 or not dist.is_initialized():
        return
    if together:
        with contextlib.suppress(RuntimeError):  # a rank that never comes: leave anyway
            dist.monitored_barrier(group=tp.cpu_group, timeout=LEAVE_TIMEOUT)
    dist.destroy_process_group()
