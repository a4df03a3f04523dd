"""Step outputs on the wire: a few arrays per step, not a pickled object per request.

A step at batch 256 used to leave the engine as 256 pickled RequestDelta dataclasses, about a
quarter of a millisecond of the engine process's host time to pickle and more to unpickle on the
other side. Here a step is one multipart ZMQ message of flat arrays, one entry per request:

    kind     b"S" (a step) or b"O" (any other message, pickled: EngineStats, a Shutdown's reply)
    header   pickled (tokens_at, detokenized_at, extras, decode_only): two clock readings, the
             rare per-row extras (logprobs, errors), keyed by row, and whether the step ran
             decodes only (no prompt tokens: a short step, whose gap after a long one is no burst)
    rids     int64 [n]      counts  int32 [n]  new tokens of each row
    tokens   int32 [sum]    finish  uint8 [n]  index into FINISH_REASONS
    cached   int32 [n]      cached prompt tokens of each row
    text     utf-8 bytes, and text_ends int32 [n] (where each row's text ends), once detokenized

`tokens_at` is time.monotonic() when the step's tokens reached the host (the engine takes it;
CLOCK_MONOTONIC is one clock for every process of a machine), so a client can split a token's
latency into the engine's part and the frontend's. Frames are sent without copies (numpy arrays
expose their buffers) and read back as arrays over the received frames.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass, field
from itertools import chain
from typing import Any

import numpy as np

from .messages import RequestDelta

STEP, OBJECT = b"S", b"O"
FINISH_REASONS: tuple[str | None, ...] = (None, "stop", "length", "abort", "error")
FINISH_CODE = {reason: code for code, reason in enumerate(FINISH_REASONS)}


@dataclass
class Extra:
    """What a few rows carry besides tokens: logprobs when asked for, an error when it failed."""

    logprobs: list[dict[str, Any]] | None = None
    error: str | None = None
    error_code: str | None = None


@dataclass
class StepColumns:
    """One step's outputs, a column per field, a row per request."""

    rids: list[int]
    counts: list[int]
    tokens: list[int]  # every row's new tokens, one after the other
    finish: list[int]  # codes into FINISH_REASONS
    cached: list[int]
    tokens_at: float = 0.0
    detokenized_at: float = 0.0
    extras: dict[int, Extra] = field(default_factory=dict)
    texts: list[str] | None = None  # once detokenized: each row's new text
    decode_only: bool = False  # the step computed no prompt tokens

    def __len__(self) -> int:
        return len(self.rids)

    def deltas(self) -> list[RequestDelta]:
        """The rows as RequestDeltas (the shell's one request; tests)."""
        out, start = [], 0
        for row, (rid, count) in enumerate(zip(self.rids, self.counts, strict=True)):
            extra = self.extras.get(row) or Extra()
            out.append(
                RequestDelta(
                    rid=rid,
                    token_ids=self.tokens[start : start + count],
                    logprobs=extra.logprobs,
                    finish_reason=FINISH_REASONS[self.finish[row]],
                    cached_tokens=self.cached[row],
                    error=extra.error,
                    error_code=extra.error_code,
                )
            )
            start += count
        return out


def columns_of(deltas: list[RequestDelta], tokens_at: float = 0.0, decode_only: bool = False) -> StepColumns:
    extras = {
        row: Extra(d.logprobs, d.error, d.error_code)
        for row, d in enumerate(deltas)
        if d.logprobs is not None or d.error is not None
    }
    return StepColumns(
        rids=[d.rid for d in deltas],
        counts=[len(d.token_ids) for d in deltas],
        tokens=list(chain.from_iterable(d.token_ids for d in deltas)),
        finish=[FINISH_CODE[d.finish_reason] for d in deltas],
        cached=[d.cached_tokens for d in deltas],
        tokens_at=tokens_at,
        extras=extras,
        decode_only=decode_only,
    )


def encode(step: StepColumns) -> list[Any]:
    header = pickle.dumps(
        (step.tokens_at, step.detokenized_at, step.extras, step.decode_only), protocol=pickle.HIGHEST_PROTOCOL
    )
    frames: list[Any] = [
        STEP,
        header,
        np.array(step.rids, np.int64),
        np.array(step.counts, np.int32),
        np.array(step.tokens, np.int32),
        np.array(step.finish, np.uint8),
        np.array(step.cached, np.int32),
    ]
    if step.texts is not None:
        encoded = [t.encode() for t in step.texts]
        frames += [b"".join(encoded), np.cumsum([len(b) for b in encoded], dtype=np.int32)]
    return frames


def encode_object(msg: object) -> list[bytes]:
    return [OBJECT, pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL)]


def decode(frames: list[Any]) -> StepColumns | object:
    """A step's columns, or the object of an OBJECT message. `frames`: bytes or zmq Frames."""
    kind = bytes(frames[0])
    if kind == OBJECT:
        return pickle.loads(frames[1])
    if kind != STEP:
        raise ValueError(f"unknown message kind {kind!r}")
    tokens_at, detokenized_at, extras, decode_only = pickle.loads(frames[1])
    rids, counts, tokens, finish, cached = (
        np.frombuffer(f, dtype).tolist()
        for f, dtype in zip(frames[2:7], (np.int64, np.int32, np.int32, np.uint8, np.int32), strict=True)
    )
    texts = None
    if len(frames) > 7:
        blob, ends = bytes(frames[7]), np.frombuffer(frames[8], np.int32).tolist()
        texts = [blob[a:b].decode() for a, b in zip([0, *ends], ends, strict=False)]
    return StepColumns(
        rids, counts, tokens, finish, cached, tokens_at, detokenized_at, extras, texts, decode_only
    )
