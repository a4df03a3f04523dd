"""The engine process: the model, the scheduler and the KV cache, away from the API's event loop.

The frontend calls `launch_engine`, which spawns a fresh interpreter (multiprocessing "spawn":
CUDA cannot be used in a forked child) running `engine_main`. The child binds two ZMQ sockets
in a private temporary folder: requests in (PULL), step outputs out (PUSH), then reports ready
(or the error that stopped it) over a multiprocessing queue. Its loop drains the request socket,
runs one step, sends the step's token ids as arrays (engine/wire.py), and blocks only when it has
nothing to do.

It never outlives the frontend, nor hangs on it (lifeline.py): the kernel kills it when its parent
dies, its sends time out and look for a Shutdown or a dead parent, and the frontend's `shutdown`
escalates from a Shutdown message to SIGKILL after a bounded wait (it ignores SIGINT and SIGTERM,
which a group's stop sends every process: the frontend decides). A failure
handling one request's message fails that request alone. A thread beats a heartbeat, and the loop
counts its steps, in a `Pulse` the frontend watches (heartbeat.py): a frozen engine, or one stuck
in a step, is noticed.
"""

from __future__ import annotations

import dataclasses
import logging
import multiprocessing as mp
import queue
import shutil
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zmq

from ..core.config import EngineConfig
from ..core.errors import UserError
from ..core.heap import freeze_startup_heap
from ..core.logs import setup_logging
from ..engine.core import EngineCore
from ..engine.messages import (
    ENGINE_DEAD,
    AbortRequest,
    AddRequest,
    EngineInfo,
    RequestDelta,
    Shutdown,
    StatsQuery,
)
from ..engine.wire import columns_of, encode
from .build import build_engine
from .heartbeat import Heartbeat, Pulse
from .lifeline import EngineExit, Inbox, Outbox, ParentWatch, die_with_parent, ignore_stop_signals
from .ranks import FAILED_EXIT_CODE as ENGINE_FAILED_EXIT  # a lost tensor-parallel rank
from .step_trace import install_from_env

log = logging.getLogger(__name__)

IDLE_POLL_MS = 500  # how often an idle engine checks that its parent is still alive
SHUTDOWN_GRACE_S = 5.0  # a Shutdown message, then SIGKILL after this long at most


@dataclass
class EngineProcess:
    """The frontend's handle on a running engine process."""

    process: mp.process.BaseProcess
    request_addr: str
    output_addr: str
    info: EngineInfo
    socket_dir: str
    pulse: Pulse | None = None  # its heartbeat and step counters (heartbeat.py), for the frontend's watch

    def is_alive(self) -> bool:
        return self.process.is_alive()

    def shutdown(self, grace: float = SHUTDOWN_GRACE_S) -> None:
        """Ask the engine to exit, then make sure it has: within about 2 x grace + 1 s, whatever
        it is doing."""
        if self.process.is_alive():
            sock = zmq.Context.instance().socket(zmq.PUSH)
            sock.setsockopt(zmq.LINGER, 500)
            sock.connect(self.request_addr)
            try:
                sock.send_pyobj(Shutdown(), zmq.NOBLOCK)
            except zmq.ZMQError:
                pass  # it cannot be told: SIGKILL below still works
            sock.close()
            self.process.join(grace)
        if self.process.is_alive():  # SIGKILL: it ignores SIGTERM (lifeline.ignore_stop_signals)
            log.warning("the engine did not stop within %.0f s; killing it", grace)
            self.process.kill()
            self.process.join(grace)
        shutil.rmtree(self.socket_dir, ignore_errors=True)


EngineBuilder = Callable[[EngineConfig, Path], EngineCore]


def launch_engine(
    config: EngineConfig,
    model_dir: Path,
    log_level: str = "info",
    start_timeout: float = 600.0,
    build: EngineBuilder = build_engine,
) -> EngineProcess:
    """Spawn the engine process and wait until its model is loaded; a UserError if it fails.
    `build` makes the engine in the child (a module-level function: it is pickled); tests pass a
    stand-in that emits tokens on a clock, to drive the real process loop and server without a model."""
    socket_dir = tempfile.mkdtemp(prefix="final-engine-")  # mode 0700: only this user's processes
    request_addr, output_addr = f"ipc://{socket_dir}/requests", f"ipc://{socket_dir}/outputs"
    ctx = mp.get_context("spawn")
    ready: Any = ctx.Queue()
    pulse = Pulse.create(ctx)
    process = ctx.Process(
        target=engine_main,
        args=(config, str(model_dir), request_addr, output_addr, ready, log_level, pulse, build),
        name="final-engine",
        daemon=True,
    )
    process.start()
    deadline = time.monotonic() + start_timeout
    while True:
        try:
            kind, payload = ready.get(timeout=0.5)
            break
        except queue.Empty:
            if not process.is_alive():
                shutil.rmtree(socket_dir, ignore_errors=True)
                raise UserError(
                    f"the engine process exited during start-up (exit code {process.exitcode})"
                ) from None
            if time.monotonic() > deadline:
                process.kill()
                shutil.rmtree(socket_dir, ignore_errors=True)
                raise UserError(f"the engine did not start within {start_timeout:.0f} s") from None
    if kind != "ready":
        process.join(10)
        shutil.rmtree(socket_dir, ignore_errors=True)
        raise UserError(payload)
    return EngineProcess(process, request_addr, output_addr, payload, socket_dir, pulse)


def engine_main(
    config: EngineConfig,
    model_dir: str,
    request_addr: str,
    output_addr: str,
    ready: Any,
    log_level: str,
    pulse: Pulse | None = None,
    build: EngineBuilder = build_engine,
) -> None:
    # Ctrl-C in the terminal (or a group's SIGTERM) reaches every process of the group. It is the
    # frontend's to handle (the shell stops an answer, the server shuts down and then stops us).
    ignore_stop_signals()
    parent = ParentWatch()
    die_with_parent()  # before the model loads: a frontend killed meanwhile takes us along
    setup_logging(log_level)
    try:
        core = build(config, Path(model_dir))
    except UserError as err:
        ready.put(("error", str(err)))
        return
    except Exception as err:  # a crash while loading: report it, with the traceback in the log
        log.error("engine failed to start:\n%s", traceback.format_exc())
        ready.put(("error", f"the engine failed to start: {type(err).__name__}: {err}"))
        return
    ctx = zmq.Context()
    requests, outputs = ctx.socket(zmq.PULL), ctx.socket(zmq.PUSH)
    requests.bind(request_addr)
    outputs.bind(output_addr)
    if pulse is not None:
        Heartbeat(pulse).start()  # a daemon thread: it ends with the process
    freeze_startup_heap("engine")  # the model, its graphs, the pool: never garbage (core/heap.py)
    ready.put(("ready", core.info()))
    trace = install_from_env(core)  # FINAL_STEP_TRACE: a benchmark's per-step log (step_trace.py)
    try:
        serve(core, requests, outputs, parent, pulse)
    except EngineExit as reason:
        log.info("engine exiting: %s", reason)
    finally:
        core.close()  # the tensor-parallel ranks (none at --tp 1)
        if trace is not None:
            trace.close()
        requests.close(linger=0)
        outputs.close(linger=1000)
        ctx.term()


def serve(
    core: EngineCore,
    requests: zmq.Socket,
    outputs: zmq.Socket,
    parent: ParentWatch,
    pulse: Pulse | None = None,
) -> None:
    """The loop, until EngineExit (a Shutdown message, or the frontend gone)."""
    inbox = Inbox(requests)
    outbox = Outbox(outputs, inbox, parent)
    poller = zmq.Poller()
    poller.register(requests, zmq.POLLIN)

    def publish(
        deltas: list[RequestDelta],
    ) -> None:  # one message a step: its tokens as arrays (engine/wire.py)
        if deltas:
            outbox.send_frames(step_frames(core, deltas))

    # A step in flight whose tokens are ready while the host launches an eager step goes out at once
    # (engine/delivery.py), not after the launch: its own message, with its own stamp.
    core.publish = publish
    while True:
        # Block only when idle; with work to do, take whatever has arrived and go on.
        if not inbox.backlog and not dict(poller.poll(0 if core.has_work() else IDLE_POLL_MS)):
            if parent.gone():
                raise EngineExit("the frontend is gone")
        deltas: list[RequestDelta] = []
        for msg in inbox.take_all():
            try:
                reply = handle(core, msg)
            except Exception as err:  # a bug in handling one message fails that request alone
                log.error("engine failed to handle %r:\n%s", msg, traceback.format_exc())
                rid = getattr(msg, "rid", None)
                reply = (
                    None
                    if rid is None
                    else RequestDelta(rid, [], finish_reason="error", error=f"{type(err).__name__}: {err}")
                )
            if isinstance(reply, RequestDelta):
                deltas.append(reply)
            elif reply is not None:
                outbox.send(reply)
        if core.has_work() or core.failed:
            try:
                deltas += timed_step(core, pulse)
            except Exception as err:  # keep serving: fail the requests in flight, not the server
                if not core.failed:  # (a lost rank was logged, with its reason, when it was found)
                    log.error("engine step failed:\n%s", traceback.format_exc())
                failed = core.fail_all(f"the engine failed: {type(err).__name__}: {err}")
                if core.failed:  # a tensor-parallel rank is lost: tell the clients, then exit
                    deltas += [dataclasses.replace(d, error_code=ENGINE_DEAD) for d in failed]
                    outbox.send_frames(step_frames(core, deltas))
                    raise SystemExit(ENGINE_FAILED_EXIT) from err
                deltas += failed
            if parent.gone():
                raise EngineExit("the frontend is gone")
        publish(deltas)


def step_frames(core: EngineCore, deltas: list[RequestDelta]) -> list[Any]:
    """A step's deltas as one wire message, stamped with the collected step's time and kind."""
    return encode(columns_of(deltas, core.tokens_ready_at, core.collected_decode_only))


def timed_step(core: EngineCore, pulse: Pulse | None) -> list[RequestDelta]:
    """One step, counted in the pulse, so the frontend can tell a long step from a hung one."""
    if pulse is None:
        return core.step()
    pulse.step_begins()
    try:
        return core.step()
    finally:
        pulse.step_ends()


def handle(core: EngineCore, msg: object) -> object | None:
    if isinstance(msg, AddRequest):
        try:
            core.add_request(msg.rid, msg.prompt_ids, msg.params)
        except UserError as err:
            return RequestDelta(
                rid=msg.rid, token_ids=[], finish_reason="error", error=str(err), error_code="invalid_request"
            )
        return None
    if isinstance(msg, AbortRequest):
        core.abort(msg.rid)
        return None
    if isinstance(msg, StatsQuery):
        stats = core.snapshot(msg.query_id)
        try:
            core.check_integrity()
        except AssertionError as err:  # a bug, not a reason to stop serving: report it loudly
            log.error("%s", err)
            stats.extra["integrity_error"] = str(err)
        return stats
    log.warning("engine ignoring unknown message %r", msg)
    return None
