"""`python -m final`: resolve the model, start the engine process, serve HTTP until Ctrl-C."""

from __future__ import annotations

import argparse
import logging
import socket

from ..core.config import EngineConfig
from ..core.errors import UserError
from ..frontend.tokenizer import Tokenizer
from ..models import resolve_model
from ..scheduler import validate_early
from ..scheduler.process import launch_engine, setup_logging
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
    setup_logging(log_level)
    validate_early(config)  # a bad flag fails here, before any process or model is touched
    if args.max_waiting_requests < 0:
        raise UserError(f"--max-waiting-requests must be >= 0, got {args.max_waiting_requests}")
    check_port_free(args.host, args.port)  # before minutes of model loading, not after
    model_dir = resolve_model(config.model)  # converts the default model once, in this process
    tokenizer = Tokenizer(model_dir)
    log.info("starting the engine for %s", model_dir)
    engine = launch_engine(config, model_dir, log_level)
    served = args.served_model_name or model_dir.name
    accepted = {served, model_dir.name, str(model_dir)} | ({config.model} if config.model else set())
    state = StateFactory(
        tokenizer=tokenizer, info=engine.info, served_model_name=served, accepted_model_names=accepted,
        max_in_flight=config.max_running_requests + args.max_waiting_requests,
    )  # fmt: skip
    info = engine.info
    log.info(
        "serving %r on http://%s:%d (device %s, %s, attention %s, %d KV pages of %d tokens, cache %s)",
        served, args.host, args.port, info.device, info.dtype, info.attn, info.num_pages, info.page_size, info.cache,
    )  # fmt: skip
    try:
        uvicorn.run(
            create_app(state, engine), host=args.host, port=args.port, log_level=log_level,
            timeout_graceful_shutdown=5,
        )  # fmt: skip
    finally:
        engine.shutdown()
    return 0
