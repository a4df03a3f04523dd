"""Tensor parallelism's bookkeeping: which rank this process is, how a dimension splits over the
ranks, and the two collectives a sharded decoder needs (all-reduce after a row-parallel matmul,
all-gather of vocabulary-sharded logits).

A `TPInfo` is passed explicitly to whatever needs it (layers, the pool, the runner); there is no
module-level state. With one rank (`TPInfo()`) every method is a no-op, so a single-GPU engine
pays nothing for it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class TPInfo:
    rank: int = 0
    size: int = 1
    group: Any = None  # the torch.distributed process group of the ranks, when size > 1

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
        """(first head, heads) of the KV heads this rank holds."""
        if num_kv_heads < self.size:
            return self.rank * num_kv_heads // self.size, 1
        return self.shard(num_kv_heads, "KV heads")

    def padded_vocab(self, vocab_size: int) -> int:
        """The vocabulary rounded up to a multiple of the ranks, so each holds an equal slice."""
        return -(-vocab_size // self.size) * self.size

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum `x` over the ranks, in place."""
        if self.size > 1:
            torch.distributed.all_reduce(x, group=self.group)
        return x

    def all_gather(self, x: torch.Tensor) -> torch.Tensor:
        """Concatenate every rank's `x` along the last dimension."""
        if self.size == 1:
            return x
        parts = [torch.empty_like(x) for _ in range(self.size)]
        torch.distributed.all_gather(parts, x.contiguous(), group=self.group)
        return torch.cat(parts, dim=-1)


__all__ = ["TPInfo"]
