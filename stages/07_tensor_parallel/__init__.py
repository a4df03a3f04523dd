"""Stage 07 — tensor parallelism: the model sharded over several GPUs (or CPU processes).

One GPU holds the whole model and reads all of its weights at every decode step. Here the model
is split over `--tp` ranks, one process each: every rank holds a share of the attention heads
(q/k/v split by output, o_proj by input), a share of the MLP (gate/up by output, down_proj by
input), a share of the vocabulary (embedding and LM head, padded to a multiple of the ranks) and
the KV cache of its own KV heads (replicated when there are fewer KV heads than ranks). Each
layer costs two all-reduces; the logits are gathered. Each rank reads only its slices of the
checkpoint. Rank 0 schedules, sends every step's batch to the other ranks, samples once and
broadcasts the tokens, so every rank runs the same batch in the same order and holds the same
tokens. The engine starts its ranks itself (NCCL between GPUs, gloo on the CPU), watches them,
and a rank that dies or hangs ends it with a message naming that rank. CUDA graphs (the
all-reduces captured inside them) and overlap scheduling stay on; on the CPU the tests check TP
against TP=1 with overlap on and off, and the GPU tests (NCCL, graphs) have not run on a
multi-GPU host yet.

Changed from stage 06: distributed.py (new: the sharding arithmetic, the process groups, the step
message), layers.py (new: column- and row-parallel linears, vocabulary-parallel embedding and LM
head), model.py (the sharded layers; each rank reads its slices), runner.py (the rank's own heads,
the pool size agreed by all ranks), page_table.py (rank 0 logs its writes), engine.py (rank 0
sends the step and shares the sampled tokens), ranks.py (new: starting, watching and stopping the
ranks), worker.py (new: the other ranks' loop), __main__.py (`--tp`, `--nnodes`, `--node-rank`,
`--dist-init-addr`, `--dist-timeout`). Turn the feature off: `--tp 1` (the default), or `LLM(tp=1)`.
"""

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .engine import LLM


def __getattr__(name: str):
    # The engine (and torch) load on first use, so `python -m <stage> --help` answers at once.
    if name == "LLM":
        from .engine import LLM

        return LLM
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


CHANGED_FILES: tuple[str, ...] = (
    "__main__.py",
    "distributed.py",
    "engine.py",
    "layers.py",
    "model.py",
    "page_table.py",
    "ranks.py",
    "runner.py",
    "worker.py",
)

__all__ = ["LLM", "CHANGED_FILES"]
