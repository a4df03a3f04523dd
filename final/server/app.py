"""The FastAPI application: routes, and errors in OpenAI's format whatever goes wrong."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable, Collection
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..frontend.client import BEHIND_S, AsyncEngineClient
from ..frontend.detokenizer_process import DetokenizerProcess
from ..frontend.engine_monitor import EngineMonitor, Liveness
from ..runtime.process import EngineProcess
from . import security
from .errors import APIError, internal_error
from .generation import ClientGone
from .hosts import HostCheckMiddleware
from .openai_api import chat_completions, completions
from .openapi import build_openapi
from .state import ServerState
from .tokenize_api import detokenize, tokenize

log = logging.getLogger(__name__)

# final_requests_rejected_total{reason}, by status (a 404 model_not_found is counted where it is raised)
REJECTION_REASONS = {400: "bad_request", 413: "too_large", 415: "media_type"}


def create_app(
    make_state: StateFactory,
    engine: EngineProcess,
    detokenizer: DetokenizerProcess,
    api_key: str | None = None,
    public_paths: Collection[str] = security.OPTIONAL_PUBLIC_PATHS,
    allowed_origins: Collection[str] = (),
    on_ready: Callable[[ServerState], None] | None = None,
    host_names: frozenset[str] | None = frozenset(),
    liveness: Liveness | None = None,
    on_engine_lost: Callable[[], None] | None = None,
    catch_up_s: float | None = BEHIND_S,
) -> FastAPI:
    """`host_names`: what the Host header may name besides IP addresses and localhost (hosts.py;
    None: anything). `on_engine_lost`: called once, on the event loop, when the engine is lost.
    `catch_up_s`: when the API process counts as behind (frontend/client.py; None: never)."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # The client's sockets belong to the server's event loop, so they are made here.
        client = AsyncEngineClient(engine, detokenizer, catch_up_s)
        client.on_lost = on_engine_lost
        client.start()
        monitor = EngineMonitor(engine, liveness or Liveness(), client.engine_lost, detokenizer)
        monitor.start()
        app.state.server = state = make_state(client)
        if on_ready is not None:
            on_ready(state)
        try:
            yield
        finally:
            await monitor.stop()
            await client.close()

    app = FastAPI(
        title="final",
        description="An OpenAI-compatible LLM server (the llm-serving-from-scratch book's final engine).",
        lifespan=lifespan,
        redoc_url=None,
    )
    app.openapi = lambda: build_openapi(app)  # type: ignore[method-assign]
    app.add_api_route("/v1/chat/completions", chat_completions, methods=["POST"])
    app.add_api_route("/v1/completions", completions, methods=["POST"])
    app.add_api_route("/tokenize", tokenize, methods=["POST"])
    app.add_api_route("/detokenize", detokenize, methods=["POST"])
    started = int(time.time())

    @app.get("/v1/models")
    async def models(request: Request) -> JSONResponse:
        state: ServerState = request.app.state.server
        card = {  # the name only: never the model's path on this machine
            "id": state.served_model_name,
            "object": "model",
            "created": started,
            "owned_by": "final",
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
        text = state.metrics.render(stats, state.admission.in_use)
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4")

    @app.exception_handler(APIError)
    async def api_error(request: Request, err: APIError) -> Response:
        count_rejection(request, err)
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

    # Innermost first: unexpected errors become a 500 here (the connection stays usable); the key
    # check and CORS sit outside, so a request without the key never reaches a route.
    app.add_middleware(InternalErrorMiddleware)
    security.install(app, api_key, public_paths, allowed_origins)
    app.add_middleware(HostCheckMiddleware, names=host_names)  # outermost: before CORS and the key
    return app


def count_rejection(request: Request, err: APIError) -> None:
    state: ServerState | None = getattr(request.app.state, "server", None)
    if state is None:
        return
    if err.code == "server_overloaded":
        state.metrics.rejected["overloaded"] += 1
    elif err.status in REJECTION_REASONS:
        state.metrics.rejected[REJECTION_REASONS[err.status]] += 1


class InternalErrorMiddleware:
    """Anything unexpected becomes a 500 in OpenAI's shape, and is not raised further: Starlette's
    own handler re-raises, and uvicorn then drops the keep-alive connection."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracked_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracked_send)
        except ClientGone:  # normal: the request was aborted, nobody is there to answer
            log.info("client went away: %s %s aborted", scope.get("method"), scope.get("path"))
        except Exception as err:
            body = internal_error(err, f"serving {scope.get('path')}")
            if not started:
                await body.response()(scope, receive, send)


class StateFactory:
    """Builds the ServerState once the event loop (and so the engine client) exists."""

    def __init__(self, **fields):
        self.fields = fields

    def __call__(self, client: AsyncEngineClient) -> ServerState:
        return ServerState(client=client, **self.fields)
