"""`python -m final`: resolve the model, start the engine process, serve HTTP until a signal.

Shutdown, on SIGINT (Ctrl-C) or SIGTERM, is bounded whatever is in flight: every request still
running ends at once with an error event (`shutting_down`) instead of a torn connection, uvicorn
closes the connections, and the engine process is stopped (a Shutdown message, then SIGTERM,
then SIGKILL, each after a bounded wait; runtime/process.py). uvicorn's habit of re-raising the
signal once it is done is switched off: it killed this process before the engine was stopped,
and left the engine orphaned.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

from ..core.config import EngineConfig
from ..core.errors import UserError
from ..core.heap import freeze_startup_heap
from ..frontend.client import catch_up_seconds
from ..frontend.engine_monitor import Liveness
from ..frontend.options import ServeOptions
from ..frontend.sampling_defaults import sampling_flags
from ..frontend.startup import Frontend, start_frontend
from ..models.source import DEFAULT_MODEL_ALIASES
from . import security
from .app import StateFactory, create_app
from .hosts import accepted_host_names
from .state import ServerState

if TYPE_CHECKING:
    import uvicorn

log = logging.getLogger(__name__)

GRACEFUL_SHUTDOWN_S = 5  # connections still open this long after the signal are cut
ENGINE_LOST_EXIT = 3  # the engine died or hung (the status of an engine process that lost a rank, too)
SHUTDOWN_MESSAGE = "the server is shutting down"


def check_port_free(host: str, port: int) -> None:
    try:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((host, port))
    except OSError as err:
        raise UserError(
            f"cannot serve on {host}:{port}: {err.strerror or err}; choose another --port"
        ) from err


def default_served_name(model: str | None, model_dir: Path) -> str:
    """A hub id as given (Qwen/Qwen3-0.6B: its local folder is a snapshot hash), else the folder's name."""
    if model is not None and model not in DEFAULT_MODEL_ALIASES and not Path(model).expanduser().exists():
        return model
    return model_dir.name


def make_uvicorn_server(config: uvicorn.Config, on_exit: Callable[[], None]) -> uvicorn.Server:
    """uvicorn's Server, calling `on_exit` at the first signal and not re-raising it at the end."""
    import uvicorn

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            first = not self.should_exit
            super().handle_exit(sig, frame)
            self._captured_signals.clear()  # return normally, so the engine is stopped after us
            if first:
                on_exit()

    return Server(config)


def serve(args: ServeOptions, config: EngineConfig) -> int:
    log_level = args.log_level or "info"
    api_key = args.api_key or os.environ.get(security.API_KEY_ENV) or None

    def check_flags() -> None:
        if args.max_waiting_requests < 0:
            raise UserError(f"--max-waiting-requests must be >= 0, got {args.max_waiting_requests}")
        if args.max_request_bytes < 1024:
            raise UserError(f"--max-request-bytes must be >= 1024, got {args.max_request_bytes}")
        for flag in ("read_timeout", "engine_silence_timeout"):
            if not getattr(args, flag) > 0:
                raise UserError(f"--{flag.replace('_', '-')} must be > 0, got {getattr(args, flag)}")
        if args.engine_step_timeout < 0:
            raise UserError(
                f"--engine-step-timeout must be >= 0 (0: no limit), got {args.engine_step_timeout}"
            )

    frontend = start_frontend(
        config,
        log_level,
        checks=[check_flags, lambda: check_port_free(args.host, args.port)],
        on_loading=lambda model_dir: log.info("starting the engine for %s", model_dir),
        generation_config=args.generation_config,
        sampling_flags=sampling_flags(args),
        chat_template=args.chat_template,
        detokenizer=True,
    )
    try:
        code = run_http(args, config, frontend, api_key, log_level)
    finally:
        log.info("stopping the engine")
        frontend.close()
        log.info("stopped")
    return code


def run_http(
    args: ServeOptions, config: EngineConfig, frontend: Frontend, api_key: str | None, log_level: str
) -> int:
    """Serve until a signal (exit status 0) or the loss of the engine (ENGINE_LOST_EXIT)."""
    import uvicorn

    from .event_stream import DirectSend
    from .timeouts import timed_http_protocol  # uvicorn's protocol, subclassed

    engine, model_dir, defaults = frontend.engine, frontend.model_dir, frontend.sampling_defaults
    served = args.served_model_name or default_served_name(config.model, model_dir)
    # Only the served name: accepting the folder's path too made `model` an oracle for where the
    # model lives on this machine (the right path answered 200, any other 404).
    accepted = {served}
    frontend.tokenizer.max_token_chars  # noqa: B018 (computed now, not on the first request)
    state = StateFactory(
        tokenizer=frontend.tokenizer,
        info=engine.info,
        served_model_name=served,
        accepted_model_names=accepted,
        max_in_flight=config.max_running_requests + args.max_waiting_requests,
        max_request_bytes=args.max_request_bytes,
        max_per_request=config.max_running_requests,
        read_timeout=args.read_timeout,
        sampling_defaults=defaults,
        reasoning_parser=args.reasoning_parser and args.reasoning_parser.replace("-", "_"),
        tool_call_parser=args.tool_call_parser,
    )
    info = engine.info
    log.info(
        "serving %r on http://%s:%d (device %s, %s, attention %s, KV cache of %d tokens, page size %d, "
        "prefix cache %s)",
        served,
        args.host,
        args.port,
        info.device,
        info.dtype,
        info.attn,
        info.kv_capacity,
        info.page_size,
        info.cache,
    )
    log.info("sampling defaults for requests that leave them out: %s", defaults.describe())
    security.warn_if_open(args.host, api_key)
    running: dict[str, ServerState | asyncio.AbstractEventLoop] = {}

    def on_ready(server_state: ServerState) -> None:
        running["state"], running["loop"] = server_state, asyncio.get_running_loop()
        freeze_startup_heap("api")  # FastAPI, the tokenizer, torch's imports (core/heap.py)

    def stop_requests() -> None:
        """Runs on the event loop: refuse new requests, end those in flight with an error event."""
        server_state = running["state"]
        assert isinstance(server_state, ServerState)
        server_state.admission.closing = True
        server_state.client.fail_all(SHUTDOWN_MESSAGE, code="shutting_down")

    def on_exit() -> None:  # in the signal handler: hand the work to the loop
        loop = running.get("loop")
        if isinstance(loop, asyncio.AbstractEventLoop) and not loop.is_closed():
            loop.call_soon_threadsafe(stop_requests)

    lost: list[bool] = []

    def on_engine_lost() -> None:  # on the event loop, once: the requests in flight are failed already
        lost.append(True)
        uv_server.should_exit = True  # uvicorn drains them (GRACEFUL_SHUTDOWN_S at most), then we exit

    assert frontend.detokenizer is not None, "the server starts its frontend with a detokenizer process"
    app = create_app(
        state,
        engine,
        frontend.detokenizer,
        api_key=api_key,
        public_paths=args.public_paths,
        allowed_origins=args.allowed_origins or (),
        on_ready=on_ready,
        host_names=accepted_host_names(
            args.host, args.allowed_hosts or (), not security.is_loopback(args.host)
        ),
        liveness=Liveness(args.engine_silence_timeout, args.engine_step_timeout),
        on_engine_lost=on_engine_lost,
        catch_up_s=catch_up_seconds(args.stream_catch_up_ms),
    )
    uv_config = uvicorn.Config(
        DirectSend(app),  # outside even Starlette's own error middleware (event_stream.py says why)
        host=args.host,
        port=args.port,
        log_level=log_level,
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
        http=timed_http_protocol(args.read_timeout),
        access_log=not args.disable_log_requests,
    )
    uv_server = make_uvicorn_server(uv_config, on_exit)
    uv_server.run()
    if lost:
        log.error("the engine was lost: exiting with status %d so that a supervisor restarts the server",
                  ENGINE_LOST_EXIT)  # fmt: skip
        return ENGINE_LOST_EXIT
    return 0
