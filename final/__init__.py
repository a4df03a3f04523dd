"""final/: the complete engine, standalone (it imports nothing from stages/), laid out for change.

    python -m final                       # OpenAI-compatible server for the default model on :1919
    python -m final --shell               # interactive chat in the terminal
    from final import LLM, SamplingParams # offline batch generation

Packages, and the one direction imports flow (a test enforces it; no cycles): a package imports
only from packages below it.

    server, shell           the faces: OpenAI-compatible HTTP server, interactive chat
    frontend/               tokenizer and chat template, detokenizer with stop strings, output
                            assembly, engine clients, the faces' typed options, the start-up path
    runtime/                build_engine (the one place an engine is assembled) and process
                            management: the engine process, its lifeline, the tensor-parallel
                            ranks, their worker and watchdog
    engine/                 the step: the resolved config, EngineCore (schedule -> launch ->
                            collect), the executor every rank runs (model runner, decode graphs,
                            sampler), the engine's messages and counters
    scheduler/              policy only: which tokens of which requests run next; the policies
    attention/  models/     attention backends, one descriptor each in a registry; the decoder,
                            its layers and weights, the registry of architectures
    kvcache/  distributed/  page pool, page table, prefix caches and the manager that owns a
                            request's pages; tensor parallelism's rank info, process groups and
                            the channel rank 0 sends each step over
    core/                   EngineConfig (its fields declare their flags), SamplingParams,
                            ForwardBatch, limits, errors

    llm.py the offline LLM class; args.py the command line; __main__.py the entry point

Ported from the stages so far: 01 (generate loop), 02 (paged KV, continuous batching, torch
and FlashInfer backends), 03 (the radix prefix cache, the default `--cache`) and 04 (chunked
prefill, `--max-prefill-length` and `--chunk-policy`), then decode CUDA graphs (engine/graph.py),
overlap scheduling (engine/core.py) and tensor parallelism (`--tp N`: distributed/, the sharded
layers of models/, runtime/ranks.py). docs/serving/extending.md says how to add a backend, a
policy or a model.
"""

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .core.outputs import RequestOutput
    from .core.sampling_params import SamplingParams, StructuredOutputsParams
    from .llm import LLM

__all__ = ["LLM", "RequestOutput", "SamplingParams", "StructuredOutputsParams"]


def __getattr__(name: str):
    # Loaded on first use: `python -m final --help` must not wait for torch, which llm.py imports.
    if name == "LLM":
        from .llm import LLM

        return LLM
    if name == "RequestOutput":
        from .core.outputs import RequestOutput

        return RequestOutput
    if name in ("SamplingParams", "StructuredOutputsParams"):
        from .core import sampling_params

        return getattr(sampling_params, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
