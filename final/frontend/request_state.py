"""One request as the frontend sees it: engine deltas (token ids) in, text deltas out.

The server, the shell and the offline LLM all go through this class, so text, stop strings,
finish reasons, logprobs and timings are computed the same way everywhere.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..core.outputs import RequestOutput
from ..core.sampling_params import SamplingParams
from ..engine.messages import RequestDelta
from .detokenizer import TextStream
from .tokenizer import Tokenizer


@dataclass
class OutputDelta:
    text: str
    token_ids: list[int]
    logprobs: list[dict[str, Any]] = field(default_factory=list)
    finish_reason: str | None = None


class RequestState:
    """`text_at_end`: the caller reads the text only once the request has finished (the offline
    `LLM.generate`): a request without stop strings then decodes its tokens once, at the end, in
    one push through the same detokenizer (the same text: tests/final/frontend/test_final_detokenizer.py), instead
    of twice per token while the engine waits for the host. Streaming callers get text per delta."""

    def __init__(
        self,
        rid: int,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        tokenizer: Tokenizer,
        text_at_end: bool = False,
    ):
        self.rid = rid
        self.params = params
        self.stream = TextStream(tokenizer.for_request(params.skip_special_tokens), prompt_ids, params.stop)
        self.text_at_end = text_at_end and not params.stop
        self.output = RequestOutput(prompt_ids=list(prompt_ids))
        self.arrival = time.perf_counter()
        self.error: str | None = None
        self.error_code: str | None = None  # see RequestDelta.error_code
        # True when a stop string ended the request while the engine is still generating it: the
        # caller must abort it in the engine so its pages come back.
        self.needs_abort = False

    @property
    def finished(self) -> bool:
        return self.output.finish_reason is not None

    def apply(self, delta: RequestDelta) -> OutputDelta | None:
        """Fold one engine delta in; None once finished (tokens the engine made after a stop string)."""
        if self.finished:
            return None
        now = time.perf_counter() - self.arrival
        out = self.output
        out.cached_tokens = delta.cached_tokens
        if delta.error is not None:
            self.error, self.error_code = delta.error, delta.error_code
            out.finish_reason = "error"
            out.latency_s = now
            return OutputDelta(text="", token_ids=[], finish_reason="error")
        new = OutputDelta(text="", token_ids=[])
        for i, token in enumerate(delta.token_ids):
            out.token_ids.append(token)
            out.token_times.append(now)
            new.token_ids.append(token)
            if delta.logprobs is not None:
                out.logprobs.append(delta.logprobs[i])
                new.logprobs.append(delta.logprobs[i])
            if self.text_at_end:
                continue  # decoded once, when the request finishes
            piece, hit_stop = self.stream.push([token])
            new.text += piece
            if hit_stop:
                out.finish_reason = new.finish_reason = "stop"
                self.needs_abort = delta.finish_reason is None or i < len(delta.token_ids) - 1
                break
        if len(out.token_ids) and not out.ttft_s:
            out.ttft_s = out.token_times[0]
        if not self.finished and delta.finish_reason is not None:
            if self.text_at_end:
                new.text += self.stream.push(out.token_ids)[0]
            new.text += self.stream.finish()
            out.finish_reason = new.finish_reason = delta.finish_reason
        if self.finished:
            out.text, out.latency_s = self.stream.text, now
        return new
