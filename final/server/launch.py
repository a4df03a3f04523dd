"""`python -m final`: resolve the model, start the engine process, serve HTTP until Ctrl-C."""

from __future__ import annotations

import argparse
import logging
import socket

from ..core.config import EngineConfig
from ..core.errors import UserError
from ..frontend.sampling_defaults import sampling_flags
from ..frontend.startup import start_frontend
from .app import StateFactory, create_app

log = logging.getLogger(__name__)


def check_port_free(host: str, port: int) -> None:
    try:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((host, port))
    except OSError as err:
        raise UserError(
            f"cannot serve on {host}:{port}: {err.strerror or err}; choose another --port"
        ) from err


def serve(args: argparse.Namespace, config: EngineConfig) -> int:
    import uvicorn

    log_level = args.log_level or "info"

    def check_flags() -> None:
        if args.max_waiting_requests < 0:
            raise UserError(f"--max-waiting-requests must be >= 0, got {args.max_waiting_requests}")

    frontend = start_frontend(
        config,
        log_level,
        checks=[check_flags, lambda: check_port_free(args.host, args.port)],
        on_loading=lambda model_dir: log.info("starting the engine for %s", model_dir),
        generation_config=args.generation_config,
        sampling_flags=sampling_flags(args),
    )
    engine, model_dir, defaults = frontend.engine, frontend.model_dir, frontend.sampling_defaults
    served = args.served_model_name or model_dir.name
    accepted = {served, model_dir.name, str(model_dir)} | ({config.model} if config.model else set())
    state = StateFactory(
        tokenizer=frontend.tokenizer,
        info=engine.info,
        served_model_name=served,
        accepted_model_names=accepted,
        max_in_flight=config.max_running_requests + args.max_waiting_requests,
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
    try:
        uvicorn.run(
            create_app(state, engine),
            host=args.host,
            port=args.port,
            log_level=log_level,
            timeout_graceful_shutdown=5,
        )
    finally:
        frontend.close()
    return 0
