"""The options of the faces (server and shell), typed, each declaring its own flag (core/flags.py):
what `python -m final` takes besides the engine's (core/config.py)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from ..core.config import MODEL, positive_or_zero
from ..core.flags import option
from ..core.sampling_params import DEFAULT_MAX_TOKENS

SAMPLING, SERVER = "sampling", "server"  # the flags' groups in --help
SAMPLING_GROUP_HELP = (
    "Defaults for the requests that leave a parameter out (the server) and the shell's own values "
    "(/set changes them). A request's own value wins, then these flags, then the model's "
    "generation_config.json, then the built-in value."
)
PUBLIC_PATHS = ("/health", "/metrics", "/openapi.json", "/docs")  # what --public-paths may name
# runtime/heartbeat.py's and server/timeouts.py's defaults, written out so that `--help` imports
# neither torch nor uvicorn; tests/final/server/test_final_server_engine_loss.py keeps them equal.
DEFAULT_READ_TIMEOUT_S = 30.0
DEFAULT_SILENCE_S = 10.0
DEFAULT_STEP_TIMEOUT_S = 600.0
# Off: issue 27 asked for every stream's frames a step apart; frontend/client.py has the trade.
DEFAULT_CATCH_UP_MS = 0


def comma_list(text: str) -> tuple[str, ...]:
    return tuple(item.strip() for item in text.split(",") if item.strip())


# --tool-call-parser's names (vLLM's and SGLang's) -> the format read (server/tool_formats.py)
TOOL_CALL_PARSERS = {
    "hermes": "hermes",
    "qwen25": "hermes",  # SGLang's name for it
    "qwen": "hermes",
    "llama3_json": "llama3_json",
    "llama3": "llama3_json",  # SGLang's name for it
    "pythonic": "pythonic",  # vLLM's and SGLang's name (Llama 3.2, Llama 4)
}


def tool_call_parser(text: str) -> str:
    """--tool-call-parser: the formats final/ reads (server/tool_formats.py), under vLLM's and
    SGLang's names; another is refused with what works."""
    name = text.strip().lower()
    if name not in TOOL_CALL_PARSERS:
        raise argparse.ArgumentTypeError(
            f"{text!r}: final/ reads tool calls written as Hermes-style <tool_call> blocks (Qwen2.5 and "
            "Qwen3, Hermes): hermes (qwen25, qwen), as Llama 3.1-3.3's JSON: llama3_json (llama3), or as "
            "a Python list of calls (Llama 3.2, Llama 4): pythonic; a "
            "model that writes its calls otherwise still calls tools under tool_choice 'required' or a "
            "named function, which a grammar enforces"
        )
    return TOOL_CALL_PARSERS[name]


def public_paths(text: str) -> tuple[str, ...]:
    if text.strip().lower() == "none":
        return ()
    paths = comma_list(text)
    unknown = [p for p in paths if p not in PUBLIC_PATHS]
    if unknown:
        raise argparse.ArgumentTypeError(
            f"{', '.join(unknown)} cannot be public; choose from {', '.join(PUBLIC_PATHS)} (or none)"
        )
    return paths


@dataclass
class ServeOptions:
    served_model_name: str | None = option(
        None, "the model name the API reports and accepts; default: the folder's name", group=MODEL
    )
    chat_template: str | None = option(
        None,
        "a Jinja chat template, or a file holding one, used instead of the model's (for "
        "/v1/chat/completions and the shell)",
        group=MODEL,
    )
    reasoning_parser: str | None = option(
        None,
        "the chat answer's <think> block into `reasoning_content`, apart from `content`: qwen3 (the "
        "model opens the block) or deepseek_r1 (the prompt opens it); default: none, the text as "
        "written",
        group=MODEL,
        choices=("qwen3", "deepseek_r1", "deepseek-r1"),  # the last: SGLang's spelling
    )
    tool_call_parser: str = option(
        "hermes",
        "how tool calls are read from a chat answer under tool_choice auto: hermes, <tool_call> "
        "blocks (Qwen2.5 and Qwen3, Hermes; SGLang's qwen25 is the same), llama3_json, the "
        "answer a JSON call (Llama 3.1-3.3; SGLang's llama3), or pythonic, the answer a Python "
        "list of calls (Llama 3.2, Llama 4)",
        group=MODEL,
        parse=tool_call_parser,
    )
    enable_auto_tool_choice: bool = option(
        False,
        "accepted as vLLM takes it; tool_choice auto is on here for every request with tools",
        group=MODEL,
    )
    temperature: float | None = option(
        None,
        "0 is greedy; default: generation_config.json's, else 1.0 (OpenAI's) for the server and 0 "
        "for the shell",
        group=SAMPLING,
    )
    top_p: float | None = option(None, "default: generation_config.json's, else 1.0", group=SAMPLING)
    top_k: int | None = option(
        None, "-1: no limit; default: generation_config.json's, else -1", group=SAMPLING
    )
    min_p: float | None = option(None, "default: generation_config.json's, else 0", group=SAMPLING)
    max_tokens: int | None = option(
        None,
        "most new tokens of a chat request that sets no max_tokens (completions keep OpenAI's 16) "
        "and of a shell answer, capped by the room left in the context; 0: no cap; default: "
        f"generation_config.json's max_new_tokens, else {DEFAULT_MAX_TOKENS}",
        group=SAMPLING,
        parse=positive_or_zero,
    )
    generation_config: str = option(
        "auto",
        "where the defaults above come from: the model folder's generation_config.json (auto), "
        "nowhere (none: built-in values), or FOLDER/generation_config.json",
        group=SAMPLING,
        metavar="{auto,none,FOLDER}",
    )
    host: str = option(
        "127.0.0.1",  # loopback: serving beyond this machine is an explicit choice
        "address to bind; 0.0.0.0 serves other machines too",
        group=SERVER,
    )
    port: int = option(1919, "HTTP port", group=SERVER)
    max_waiting_requests: int = option(
        1024, "requests queued beyond --max-running-requests before the server answers 503", group=SERVER
    )
    max_request_bytes: int = option(
        4 * 1024 * 1024,
        "largest request body accepted; a larger one gets 413",
        group=SERVER,
        parse=positive_or_zero,
    )
    api_key: str | None = option(
        None,
        "require 'Authorization: Bearer KEY' on every path but --public-paths; default: the "
        "FINAL_API_KEY environment variable (which `ps` does not show), else no key",
        group=SERVER,
    )
    public_paths: tuple[str, ...] = option(
        PUBLIC_PATHS,
        f"with an API key, the paths that need none: a comma list of {', '.join(PUBLIC_PATHS)}, or none",
        group=SERVER,
        parse=public_paths,
    )
    allowed_origins: tuple[str, ...] | None = option(
        None,
        "CORS: web origins that may call the API from a browser (comma list, or *); default: none",
        group=SERVER,
        parse=comma_list,
    )
    allowed_hosts: tuple[str, ...] | None = option(
        None,
        "host names the Host header may carry (comma list, or *), besides IP addresses, localhost, "
        "the --host name and, when bound beyond loopback, this machine's names; guards against DNS "
        "rebinding; default: none more",
        group=SERVER,
        parse=comma_list,
    )
    read_timeout: float = option(
        DEFAULT_READ_TIMEOUT_S,
        "seconds a client may take to send a request's headers, and then its body (a 408)",
        group=SERVER,
    )
    engine_silence_timeout: float = option(
        DEFAULT_SILENCE_S,
        "seconds the engine process may show no sign of life (stopped, frozen) before the server "
        "ends every request with 503 engine_dead and exits with status 3",
        group=SERVER,
    )
    engine_step_timeout: float = option(
        DEFAULT_STEP_TIMEOUT_S,
        "seconds one engine step may run before the engine counts as hung (as above); it must "
        "outlast the longest prefill and a GPU's first-use kernel compiles; 0: no limit",
        group=SERVER,
    )
    stream_catch_up_ms: int = option(
        DEFAULT_CATCH_UP_MS,
        "once a step's tokens are this many ms old in the API process (it cannot write frames as "
        "fast as they come), it delivers the steps waiting together and each stream writes its "
        "frames in hand in one send: the lag stays bounded, the frames arrive in bunches; 0: "
        "never (each stream's frames a step apart, however far behind); 50 was measured",
        group=SERVER,
        parse=positive_or_zero,
    )
    disable_log_requests: bool = option(
        False, "no log line per HTTP request (uvicorn's access log)", group=SERVER
    )
    shell: bool = option(False, "chat in this terminal instead of serving HTTP", group=SERVER)
    log_level: str | None = option(
        None,
        "log level of the server and the engine process; default: info, warning for --shell",
        group=SERVER,
        choices=("debug", "info", "warning", "error"),
    )
