"""The server's detokenizer process: between the API process and the engine process, it turns each
step's tokens into text, in batch, and matches stop strings, so that neither the engine's loop nor
the API's event loop spends its time on it.

    API process --requests--> detokenizer --requests--> engine
    API process <--text------ detokenizer <--tokens---- engine

Requests pass through (it reads each AddRequest's prompt tail and stop strings, and an
AbortRequest forgets its request); each step comes back as one message with every running
request's new tokens, their text and finish reasons (engine/wire.py, `texts` filled in), which
the API process hands to its requests, one wake-up each. A stop string that ends a request is
matched here, and the engine is told at once (an AbortRequest), so the request's pages come back
without a round trip through the API process. EngineStats pass through unchanged.

The process starts before the engine is loaded (its imports overlap the model's) and learns the
engine's addresses once the engine is up (`connect`). It dies with its parent (lifeline.py's
die_with_parent), and the server's watch treats its loss as the engine's (engine_monitor.py).
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import pickle
import queue
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zmq

from ..core.errors import UserError
from ..core.heap import freeze_startup_heap
from ..core.logs import setup_logging
from ..engine.messages import AbortRequest, AddRequest
from ..engine.wire import OBJECT, StepColumns, decode, encode
from ..runtime.lifeline import ParentWatch, die_with_parent, ignore_stop_signals, name_process
from ..runtime.process import EngineProcess

log = logging.getLogger(__name__)

PROCESS_NAME = "final-detok"  # what ps and top show for it (the engine's is Python's own)
IDLE_POLL_MS = 500  # how often an idle detokenizer checks that its parent is alive
STOP_GRACE_S = 2.0


@dataclass
class DetokenizerProcess:
    """The API process's handle: where to send requests and read text from."""

    process: mp.process.BaseProcess
    request_addr: str
    output_addr: str
    socket_dir: str
    control: Any  # a multiprocessing queue: the engine's addresses go in, "ready" or an error out
    replies: Any

    def is_alive(self) -> bool:
        return self.process.is_alive()

    def connect(self, engine: EngineProcess, timeout: float = 120.0) -> None:
        """Hand it the engine's addresses and wait until it is serving; a UserError if it fails."""
        self.control.put((engine.request_addr, engine.output_addr))
        deadline = time.monotonic() + timeout
        while True:
            try:
                kind, payload = self.replies.get(timeout=0.5)
                break
            except queue.Empty:
                if not self.process.is_alive():
                    raise UserError(
                        f"the detokenizer process exited during start-up (exit code {self.process.exitcode})"
                    ) from None
                if time.monotonic() > deadline:
                    raise UserError(f"the detokenizer did not start within {timeout:.0f} s") from None
        if kind != "ready":
            raise UserError(payload)

    def shutdown(self) -> None:
        """It holds nothing to save: SIGKILL (it ignores SIGTERM: lifeline.ignore_stop_signals)."""
        if self.process.is_alive():
            self.process.kill()
            self.process.join(STOP_GRACE_S)
        shutil.rmtree(self.socket_dir, ignore_errors=True)


def start_detokenizer(model_dir: Path, log_level: str = "info") -> DetokenizerProcess:
    """Spawn it (it loads the tokenizer meanwhile); `connect` it once the engine is up."""
    socket_dir = tempfile.mkdtemp(prefix="final-detok-")  # mode 0700: only this user's processes
    request_addr, output_addr = f"ipc://{socket_dir}/requests", f"ipc://{socket_dir}/outputs"
    ctx = mp.get_context("spawn")
    control, replies = ctx.Queue(), ctx.Queue()
    process = ctx.Process(
        target=detokenizer_main,
        args=(str(model_dir), request_addr, output_addr, control, replies, log_level),
        name="final-detokenizer",
        daemon=True,
    )
    process.start()
    return DetokenizerProcess(process, request_addr, output_addr, socket_dir, control, replies)


def detokenizer_main(
    model_dir: str, request_addr: str, output_addr: str, control: Any, replies: Any, log_level: str
) -> None:
    ignore_stop_signals()  # Ctrl-C, or a group's SIGTERM, is the server's to handle
    parent = ParentWatch()
    die_with_parent()
    name_process(PROCESS_NAME)
    setup_logging(log_level)
    from .step_text import StepDetokenizer
    from .tokenizer import Tokenizer

    try:
        detok = StepDetokenizer(Tokenizer(Path(model_dir)))
    except UserError as err:
        replies.put(("error", str(err)))
        return
    engine_requests, engine_outputs = control.get()
    ctx = zmq.Context()
    sockets = Sockets(ctx, request_addr, output_addr, engine_requests, engine_outputs)
    freeze_startup_heap("detokenizer")  # the tokenizer: never garbage (core/heap.py)
    replies.put(("ready", None))
    try:
        relay(detok, sockets, parent)
    finally:
        sockets.close()
        ctx.term()


class Sockets:
    def __init__(
        self, ctx: zmq.Context, request_addr: str, output_addr: str, engine_requests: str, engine_outputs: str
    ):
        self.from_api, self.to_api = ctx.socket(zmq.PULL), ctx.socket(zmq.PUSH)
        self.to_engine, self.from_engine = ctx.socket(zmq.PUSH), ctx.socket(zmq.PULL)
        for sock in (self.to_api, self.to_engine):
            sock.setsockopt(zmq.SNDHWM, 0)  # never block: admission bounds what is in flight
        self.from_api.bind(request_addr)
        self.to_api.bind(output_addr)
        self.to_engine.connect(engine_requests)
        self.from_engine.connect(engine_outputs)

    def close(self) -> None:
        for sock in (self.from_api, self.to_api, self.to_engine, self.from_engine):
            sock.close(linger=0)


def relay(detok: Any, sockets: Sockets, parent: ParentWatch) -> None:
    """Until the parent is gone: requests through to the engine, steps back as text."""
    poller = zmq.Poller()
    poller.register(sockets.from_api, zmq.POLLIN)
    poller.register(sockets.from_engine, zmq.POLLIN)
    while True:
        ready = dict(poller.poll(IDLE_POLL_MS))
        if not ready and parent.gone():
            return
        if sockets.from_api in ready:  # first: a request is known before the engine answers it
            while (raw := _recv(sockets.from_api)) is not None:
                msg = pickle.loads(raw)
                if isinstance(msg, AddRequest):
                    detok.add(msg.rid, msg.prompt_ids[-8:], msg.params.stop, msg.params.skip_special_tokens)
                elif isinstance(msg, AbortRequest):
                    detok.drop(msg.rid)
                sockets.to_engine.send(raw)  # as it came: no second pickling
        if sockets.from_engine in ready:
            while (frames := _recv_multipart(sockets.from_engine)) is not None:
                if bytes(frames[0]) == OBJECT:
                    sockets.to_api.send_multipart(frames, copy=False)
                    continue
                step = decode(frames)
                assert isinstance(step, StepColumns)
                text, aborts = detok.step(step)
                for rid in aborts:
                    sockets.to_engine.send(pickle.dumps(AbortRequest(rid)))
                if len(text):
                    text.detokenized_at = time.monotonic()
                    sockets.to_api.send_multipart(encode(text), copy=False)


def _recv(sock: zmq.Socket) -> bytes | None:
    try:
        return sock.recv(zmq.NOBLOCK)
    except zmq.Again:
        return None


def _recv_multipart(sock: zmq.Socket) -> list[Any] | None:
    try:
        return sock.recv_multipart(zmq.NOBLOCK, copy=False)
    except zmq.Again:
        return None
