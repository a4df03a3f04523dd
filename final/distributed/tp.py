"""Tensor parallelism's bookkeeping: which rank this process is, how a dimension splits over the
ranks, and the collectives a sharded decoder needs.

A `TPInfo` is passed explicitly to whatever needs it (layers, the pool, the runner); there is no
module-level state. With one rank (`TPInfo()`) every method is a no-op, so a single-GPU engine
pays nothing for it.

Two process groups join the ranks (group.py makes them):

    group       the device's: NCCL on GPUs, gloo on the CPU. The model's collectives (an
                all-reduce after each row-parallel matmul and after the embedding, an all-gather
                of the vocabulary-sharded logits) and the broadcast of each step's sampled tokens.
    cpu_group   always gloo, on the host: rank 0 sends each step's batch over it (step_channel.py),
                and the ranks agree on start-up numbers (the KV pool's size) through it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class TPInfo:
    rank: int = 0
    size: int = 1
    group: Any = None  # the device's process group (NCCL or gloo), when size > 1
    cpu_group: Any = None  # a gloo group on the host, when size > 1
    one_shot: Any = None  # small all-reduces over NVLink, where switched on (one_shot.py)

    @property
    def is_first(self) -> bool:
        return self.rank == 0

    def split(self, total: int, what: str = "dimension") -> int:
        """This rank's share of `total` (which must divide evenly)."""
        if total % self.size:
            raise ValueError(f"{what} of {total} does not split over {self.size} tensor-parallel ranks")
        return total // self.size

    def shard(self, total: int, what: str = "dimension") -> tuple[int, int]:
        """(start, length) of this rank's slice of a dimension of size `total`."""
        length = self.split(total, what)
        return self.rank * length, length

    def local_kv_heads(self, num_kv_heads: int) -> int:
        """KV heads this rank holds: a share of them, or one (replicated) when there are fewer KV
        heads than ranks."""
        if num_kv_heads < self.size:
            if self.size % num_kv_heads:
                raise ValueError(
                    f"{num_kv_heads} KV heads cannot be replicated evenly over {self.size} ranks"
                )
            return 1
        return self.split(num_kv_heads, "KV heads")

    def kv_head_shard(self, num_kv_heads: int) -> tuple[int, int]:
        """(first head, heads) of the KV heads this rank holds. With fewer KV heads than ranks,
        size / num_kv_heads consecutive ranks hold the same head: the one their query heads use."""
        if num_kv_heads < self.size:
            return self.rank * num_kv_heads // self.size, self.local_kv_heads(num_kv_heads)
        return self.shard(num_kv_heads, "KV heads")

    def padded_vocab(self, vocab_size: int) -> int:
        """The vocabulary rounded up to a multiple of the ranks, so each holds an equal slice."""
        return -(-vocab_size // self.size) * self.size

    # ------------------------------------------------------------------ collectives of the model

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum `x` over the ranks: in place through NCCL, or into a new tensor through the
        one-shot all-reduce where it is on and `x` fits it. Use the tensor returned."""
        if self.size > 1:
            if self.one_shot is not None and self.one_shot.fits(x):
                return self.one_shot(x)
            torch.distributed.all_reduce(x, group=self.group)
        return x

    def all_gather(self, x: torch.Tensor) -> torch.Tensor:
        """Concatenate every rank's `x` [..., n] along the last dimension: one collective into one
        buffer (what CUDA-graph capture likes), rank r's rows after rank r-1's, then each rank's
        block moved to columns r * n."""
        if self.size == 1:
            return x
        dist = torch.distributed
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor  # renamed in 2.13
        rows = x.reshape(-1, x.shape[-1])
        out = torch.empty((self.size * rows.shape[0], rows.shape[1]), dtype=x.dtype, device=x.device)
        gather(out, rows.contiguous(), group=self.group)
        blocks = out.view(self.size, rows.shape[0], rows.shape[1]).transpose(0, 1)
        return blocks.reshape(*x.shape[:-1], self.size * x.shape[-1])

    def broadcast(self, x: torch.Tensor) -> torch.Tensor:
        """Rank 0's `x` on every rank, in place (on the device: it does not wait for the GPU)."""
        if self.size > 1:
            torch.distributed.broadcast(x, src=0, group=self.group)
        return x

    # ------------------------------------------------------------------ host-side agreements

    def min_over_ranks(self, value: int) -> int:
        """The smallest of every rank's `value` (each rank measures its own free memory, but every
        rank must build a KV pool of the same size: rank 0's page ids index all of them)."""
        if self.size == 1:
            return value
        t = torch.tensor([value], dtype=torch.int64)
        torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MIN, group=self.cpu_group)
        return int(t.item())

    def barrier(self) -> None:
        """Wait on the host until every rank gets here (the CPU group has no short timeout, so a
        rank that takes minutes longer to read its weights does not trip the device group's)."""
        if self.size > 1:
            torch.distributed.barrier(group=self.cpu_group)


__all__ = ["TPInfo"]
