"""The tensor-parallel options of EngineConfig (core/config.py), a part of it with its own checks:
the model sharded over `tp` ranks, one process each (runtime/ranks.py); across machines, `nnodes`
nodes of tp / nnodes ranks meeting at `dist_init_addr`. EngineConfig inherits them, so a flag, a
keyword of `LLM(...)` and a field all read the same; --help lists them in their own group."""

from __future__ import annotations

from dataclasses import dataclass

from .flags import option

PARALLEL = "tensor parallelism"  # their group in --help


@dataclass
class ParallelOptions:
    tp: int = option(
        1,
        "tensor-parallel degree: the model sharded over this many GPUs (rank i on cuda:i of its "
        "node), or this many processes with gloo on the CPU; the engine starts the ranks itself",
        group=PARALLEL,
        aliases=("--tp-size", "--tensor-parallel-size", "-tp"),
    )
    nnodes: int = option(1, "machines the --tp ranks span, tp / nnodes each", group=PARALLEL)
    node_rank: int = option(
        0,
        "this machine's index: 0 runs the engine and the server; any other starts its ranks "
        "for node 0 and takes every engine flag from it",
        group=PARALLEL,
    )
    dist_init_addr: str | None = option(
        None,
        "where the ranks meet (torch.distributed's TCP rendezvous, served by node 0; needed with "
        "--nnodes > 1); default: a free loopback port",
        group=PARALLEL,
        metavar="HOST:PORT",
    )
    dist_timeout: float = option(
        600.0,
        "seconds a collective may wait for the other ranks, and (at most 30) a rank may go "
        "unheard, before the engine stops with a message naming the rank",
        group=PARALLEL,
    )

    @property
    def ranks_per_node(self) -> int:
        return self.tp // self.nnodes

    def parallel_checks(self) -> list[tuple[bool, str]]:
        """(holds, message if not) for each rule of these options; EngineConfig.validate raises."""
        return [
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
        ]
