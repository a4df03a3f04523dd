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
from types import FrameType
from typing import TYPE_CHECKING

from ..core.config import EngineConfig
from ..core.errors import UserError
from ..frontend.options import ServeOptions
from ..frontend.sampling_defaults import sampling_flags
from ..frontend.startup import Frontend, start_frontend
from . import security
from .app import StateFactory, create_app
from .state import ServerState

if TYPE_CHECKING:
    import uvicorn

log = logging.getLogger(__name__)

GRACEFUL_SHUTDOWN_S = 5  # connections still open this long after the signal are cut
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

    frontend = start_frontend(
        config,
        log_level,
        checks=[check_flags, lambda: check_port_free(args.host, args.port)],
        on_loading=lambda model_dir: log.info("starting the engine for %s", model_dir),
        generation_config=args.generation_config,
        sampling_flags=sampling_flags(args),
        chat_template=args.chat_template,
    )
    try:
        run_http(args, config, frontend, api_key, log_level)
    finally:
        log.info("stopping the engine")
        frontend.close()
        log.info("stopped")
    return 0


def run_http(
    args: ServeOptions, config: EngineConfig, frontend: Frontend, api_key: str | None, log_level: str
) -> None:
    import uvicorn

    engine, model_dir, defaults = frontend.engine, frontend.model_dir, frontend.sampling_defaults
    served = args.served_model_name or model_dir.name
    accepted = {served, model_dir.name, str(model_dir)} | ({config.model} if config.model else set())
    frontend.tokenizer.max_token_chars  # noqa: B018 (computed now, not on the first request)
    state = StateFactory(
        tokenizer=frontend.tokenizer,
        info=engine.info,
        served_model_name=served,
        accepted_model_names=accepted,
        max_in_flight=config.max_running_requests + args.max_waiting_requests,
        max_request_bytes=args.max_request_bytes,
        sampling_defaults=defaults,
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

    app = create_app(
        state,
        engine,
        api_key=api_key,
        public_paths=args.public_paths,
        allowed_origins=args.allowed_origins or (),
        on_ready=on_ready,
    )
    uv_config = uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        log_level=log_level,
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
        access_log=not args.disable_log_requests,
    )
    make_uvicorn_server(uv_config, on_exit).run()
