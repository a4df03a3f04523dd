"""The FastAPI application: routes, and errors in OpenAI's format whatever goes wrong."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from starlette.exceptions import HTTPException

from ..engine.process import EngineProcess
from ..frontend.client import AsyncEngineClient
from .errors import APIError
from .generation import ClientGone
from .openai_api import chat_completions, completions
from .state import ServerState

log = logging.getLogger(__name__)


def create_app(make_state: StateFactory, engine: EngineProcess) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # The client's sockets belong to the server's event loop, so they are made here.
        client = AsyncEngineClient(engine)
        client.start()
        app.state.server = make_state(client)
        try:
            yield
        finally:
            await client.close()

    app = FastAPI(title="final", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.add_api_route("/v1/chat/completions", chat_completions, methods=["POST"])
    app.add_api_route("/v1/completions", completions, methods=["POST"])
    started = int(time.time())

    @app.get("/v1/models")
    async def models(request: Request) -> JSONResponse:
        state: ServerState = request.app.state.server
        card = {
            "id": state.served_model_name,
            "object": "model",
            "created": started,
            "owned_by": "final",
            "root": state.info.model_dir,
            "max_model_len": state.info.max_context,
            "vocab_size": state.info.vocab_size,
        }
        return JSONResponse({"object": "list", "data": [card]})

    @app.get("/health")
    async def health(request: Request) -> Response:
        state: ServerState = request.app.state.server
        if state.client.dead:
            return APIError(
                503, "the engine process has stopped", type="server_error", code="engine_dead"
            ).response()
        return JSONResponse({"status": "ok"})

    @app.get("/metrics")
    async def metrics(request: Request) -> PlainTextResponse:
        state: ServerState = request.app.state.server
        stats = await state.client.stats()
        text = state.metrics.render(stats, state.client.num_in_flight)
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4")

    @app.exception_handler(APIError)
    async def api_error(request: Request, err: APIError) -> Response:
        if err.status == 400:
            request.app.state.server.metrics.rejected["bad_request"] += 1
        return err.response()

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, err: HTTPException) -> Response:
        kind = "not_found" if err.status_code == 404 else "invalid_request_error"
        return APIError(err.status_code, str(err.detail), type=kind).response()

    @app.exception_handler(ClientGone)
    async def client_gone(request: Request, err: ClientGone) -> Response:
        # Logged once, by generation.generate; nobody reads this answer. 499 is nginx's
        # "client closed request", so access logs tell it from a real failure.
        return Response(status_code=499)

    @app.exception_handler(Exception)
    async def internal_error(request: Request, err: Exception) -> Response:
        log.exception("unexpected error serving %s", request.url.path)
        return APIError(500, f"internal error: {type(err).__name__}: {err}", type="server_error").response()

    return app


class StateFactory:
    """Builds the ServerState once the event loop (and so the engine client) exists."""

    def __init__(self, **fields):
        self.fields = fields

    def __call__(self, client: AsyncEngineClient) -> ServerState:
        return ServerState(client=client, **self.fields)
