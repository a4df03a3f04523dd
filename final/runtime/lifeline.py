"""How a child process of the frontend (the engine, a rank) never outlives it, and never hangs on
a frontend that stopped reading.

- `die_with_parent`: on Linux the kernel sends the child SIGKILL the moment its parent dies
  (prctl PR_SET_PDEATHSIG), whatever the child is doing: loading weights, running a step, or
  blocked in a send. Elsewhere the child polls (`ParentWatch`).
- `ignore_stop_signals`: a stop signal sent to the whole process group is the frontend's to act
  on; the child waits for the frontend's word (or dies with it).
- `Outbox`: the engine's sends time out (ZMQ's SNDTIMEO) instead of blocking forever when the
  frontend's receiving socket is gone (a PUSH with no peer blocks); while a send waits, the engine
  checks that its parent is alive and whether a Shutdown arrived, and gives up on either.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
from collections import deque
from typing import Any

import zmq

from ..engine.messages import Shutdown
from ..engine.wire import encode_object

log = logging.getLogger(__name__)

SEND_TIMEOUT_MS = 500  # how long one send may block before the engine looks around
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with_parent() -> None:
    """Ask the kernel to SIGKILL this process when its parent exits (Linux; a no-op elsewhere)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            log.warning("prctl(PR_SET_PDEATHSIG) failed: errno %d", ctypes.get_errno())
    except (OSError, AttributeError) as err:  # no libc to load: the polling still works
        log.warning("cannot ask to die with the parent process: %s", err)


def ignore_stop_signals() -> None:
    """Ignore SIGINT and SIGTERM in a child of the frontend. Both often reach every process of the
    group at once: a terminal's Ctrl-C, systemd's stop (KillMode=control-group, its default),
    `kill -- -PGID`, a benchmark's killpg. A child that died of one before the frontend acted was
    taken for a lost engine: an H200 server stopped that way logged "the engine is lost" and exited
    with status 3 instead of 0 (session 20). The frontend stops its children itself (a Shutdown
    message, then SIGKILL: runtime/process.py), and the kernel kills them if it dies (above)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


PR_SET_NAME = 15


def name_process(name: str) -> None:
    """The name `ps -o comm`, `top` and psutil's `name()` show for this process (Linux; 15 bytes),
    so that a process spawned by multiprocessing is told apart from its siblings."""
    if not sys.platform.startswith("linux"):
        return
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_NAME, name.encode()[:15], 0, 0, 0)
    except (OSError, AttributeError):
        pass  # a name is a convenience


class ParentWatch:
    def __init__(self, parent_pid: int | None = None):
        self.parent_pid = os.getppid() if parent_pid is None else parent_pid

    def gone(self) -> bool:
        return os.getppid() != self.parent_pid  # an orphan is re-parented (to init or a reaper)


class EngineExit(Exception):
    """Stop serving: a Shutdown arrived, or the frontend is gone."""


class Inbox:
    """The request socket, with a backlog for what was read while a send was waiting."""

    def __init__(self, sock: zmq.Socket):
        self.sock = sock
        self.backlog: deque[Any] = deque()

    def drain(self) -> None:
        """Read everything that has arrived into the backlog; EngineExit on a Shutdown."""
        while True:
            try:
                msg = self.sock.recv_pyobj(zmq.NOBLOCK)
            except zmq.Again:
                return
            if isinstance(msg, Shutdown):
                raise EngineExit("a Shutdown message arrived")
            self.backlog.append(msg)

    def take_all(self) -> list[Any]:
        self.drain()
        out = list(self.backlog)
        self.backlog.clear()
        return out


class Outbox:
    def __init__(self, sock: zmq.Socket, inbox: Inbox, parent: ParentWatch):
        sock.setsockopt(zmq.SNDTIMEO, SEND_TIMEOUT_MS)
        self.sock, self.inbox, self.parent = sock, inbox, parent

    def send(self, msg: Any) -> None:
        """A message other than a step's outputs (EngineStats), pickled."""
        self.send_frames(encode_object(msg))

    def send_frames(self, frames: list[Any]) -> None:
        """One multipart message (engine/wire.py), its arrays sent without a copy."""
        waited = False
        while True:
            try:
                self.sock.send_multipart(frames, copy=False)
                return
            except zmq.Again:
                if self.parent.gone():
                    raise EngineExit("the frontend is gone") from None
                self.inbox.drain()  # a Shutdown ends the wait
                if not waited:
                    log.warning("the frontend is not reading the engine's outputs; waiting")
                    waited = True
