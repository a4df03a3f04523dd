"""final/: the complete engine, standalone (it imports nothing from stages/), laid out for change.

    python -m final                       # OpenAI-compatible server for the default model on :1919
    python -m final --shell               # interactive chat in the terminal
    from final import LLM, SamplingParams # offline batch generation

Packages, and the one direction imports flow (a test enforces it; no cycles):

    server, shell  ->  frontend  ->  scheduler  ->  engine  ->  attention  ->  kvcache  ->  core
                                                         \\->  models  ------------------->  core

    core/       EngineConfig, SamplingParams, RequestOutput, ModelConfig, limits, errors
    models/     --model resolution (default model included), registry, weights, the decoder
    kvcache/    page pool, allocator, device page table, prefix-cache interface (naive today)
    attention/  backend registry: torch, fi (FlashInfer); fa and trtllm registered, not ported
    engine/     model runner (a batch in, logits out) and sampler
    scheduler/  requests, continuous batching with preemption, EngineCore, the engine process
    frontend/   tokenizer, detokenizer with stop strings, output assembly, engine clients
    server/     FastAPI app: /v1/chat/completions, /v1/completions, /v1/models, /health, /metrics
    shell/      the interactive chat
    llm.py      the offline LLM class; args.py the command line; __main__.py the entry point

Ported from the stages so far: 01 (generate loop), 02 (paged KV, continuous batching, torch
and FlashInfer backends), 03 (the radix prefix cache, the default `--cache`) and 04 (chunked
prefill, `--max-prefill-length` and `--chunk-policy`). CUDA graphs, overlap scheduling and tensor
parallelism slot into engine/ and a distributed/ package as their stages land; their flags exist
already.
"""

from .core.outputs import RequestOutput
from .core.sampling_params import SamplingParams
from .llm import LLM

__all__ = ["LLM", "RequestOutput", "SamplingParams"]
