"""EngineConfig: every knob of the engine, with its default, in one typed place.

The CLI (final/args.py), the offline `LLM(**engine_kwargs)` and the engine process all build
the same object, so a flag means the same thing everywhere.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields
from typing import Any

from .errors import UserError

CHUNK_POLICIES = ("mixed", "prefill-first")  # see final/scheduler/scheduler.py
OVERLAP_MODES = ("auto", "on", "off")  # see final/engine/core.py


@dataclass
class EngineConfig:
    model: str | None = None  # HF folder, hub id, or None for the default model
    device: str = "auto"  # cpu, cuda, cuda:N or auto
    dtype: str = "auto"  # auto, float32, bfloat16, float16
    attn: str = "auto"  # NAME or PREFILL,DECODE; see final/attention
    # Tokens per KV page. None: not chosen; the attention kernels' choice is taken (1, or 64 when
    # TRT-LLM kernels serve a phase, 256 for FlashAttention 2): see final/attention/choose.py.
    page_size: int | None = None
    num_pages: int | None = None  # KV pages in the pool; None: from memory (GPU) or a fixed size (CPU)
    memory_ratio: float = 0.9  # share of GPU memory for weights + KV cache
    max_running_requests: int = 256  # rows of the page table: requests holding KV at once
    max_prefill_length: int = 8192  # prompt tokens one step may compute; longer prompts are chunked
    chunk_policy: str = "mixed"  # mixed: decodes ride along with prefill chunks; prefill-first: they wait
    max_seq_len_override: int | None = None  # cap the context below the model's own
    cache: str = "radix"  # prefix cache: radix or naive; see final/kvcache/registry.py
    cuda_graph_max_bs: int | None = None  # largest captured decode batch; None: auto; 0: off
    # Overlap scheduling: auto (on a GPU; off on the CPU, where nothing runs asynchronously), on,
    # off. FINAL_DISABLE_OVERLAP=1 in the environment turns auto off (benchmarks, ablations).
    overlap: str = "auto"
    # Tensor parallelism: the model sharded over `tp` ranks, one process each (engine/ranks.py);
    # across machines, `nnodes` nodes of tp / nnodes ranks meeting at `dist_init_addr`.
    tp: int = 1
    nnodes: int = 1
    node_rank: int = 0
    dist_init_addr: str | None = None  # HOST:PORT of node 0's rendezvous; None: a free loopback port
    dist_timeout: float = 600.0  # seconds a collective (or a silent rank) may take before the engine gives up

    def __post_init__(self) -> None:
        self.validate()

    def overlap_enabled(self, device_type: str) -> bool:
        if self.overlap != "auto":
            return self.overlap == "on"
        return device_type == "cuda" and os.environ.get("FINAL_DISABLE_OVERLAP", "") not in (
            "1",
            "true",
            "yes",
        )

    def validate(self) -> None:
        checks: list[tuple[bool, str]] = [
            (
                self.page_size is None or self.page_size >= 1,
                f"--page-size must be >= 1, got {self.page_size}",
            ),
            (
                self.num_pages is None or self.num_pages >= 1,
                f"--num-pages must be >= 1, got {self.num_pages}",
            ),
            (0 < self.memory_ratio <= 1, f"--memory-ratio must be in (0, 1], got {self.memory_ratio}"),
            (
                self.max_running_requests >= 1,
                f"--max-running-requests must be >= 1, got {self.max_running_requests}",
            ),
            (
                self.max_prefill_length >= 1,
                f"--max-prefill-length must be >= 1, got {self.max_prefill_length}",
            ),
            (
                self.max_seq_len_override is None or self.max_seq_len_override >= 2,
                f"--max-seq-len-override must be >= 2, got {self.max_seq_len_override}",
            ),
            (
                self.cuda_graph_max_bs is None or self.cuda_graph_max_bs >= 0,
                f"--cuda-graph-max-bs must be >= 0, got {self.cuda_graph_max_bs}",
            ),
            (
                self.chunk_policy in CHUNK_POLICIES,
                f"--chunk-policy must be one of {', '.join(CHUNK_POLICIES)}, got {self.chunk_policy!r}",
            ),
            (self.tp >= 1, f"--tp must be >= 1, got {self.tp}"),
            (self.nnodes >= 1, f"--nnodes must be >= 1, got {self.nnodes}"),
            (
                0 <= self.node_rank < self.nnodes,
                f"--node-rank must be in [0, --nnodes), got {self.node_rank} with --nnodes {self.nnodes}",
            ),
            (
                self.tp % self.nnodes == 0,
                f"--tp {self.tp} does not split over --nnodes {self.nnodes}: every node runs tp / nnodes ranks",
            ),
            (
                self.nnodes == 1 or self.dist_init_addr is not None,
                "--nnodes > 1 needs --dist-init-addr HOST:PORT (node 0's address, reachable from every node)",
            ),
            (self.dist_timeout > 0, f"--dist-timeout must be > 0, got {self.dist_timeout}"),
            (
                self.overlap in OVERLAP_MODES,
                f"--overlap must be one of {', '.join(OVERLAP_MODES)}, got {self.overlap!r}",
            ),
        ]
        for ok, message in checks:
            if not ok:
                raise UserError(message)

    @property
    def ranks_per_node(self) -> int:
        return self.tp // self.nnodes

    @classmethod
    def from_kwargs(cls, **kwargs: Any) -> EngineConfig:
        """Like EngineConfig(**kwargs), but an unknown keyword is a UserError naming the known ones."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(kwargs) - known)
        if unknown:
            raise UserError(
                f"unknown engine option(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}"
            )
        return cls(**kwargs)
