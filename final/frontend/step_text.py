"""A whole step's tokens to text at once: every running request's detokenizer and stop strings.

The detokenizer process (detokenizer_process.py) keeps one `TextStream` per request and turns each
step the engine sends into the same step with text: one call to the Rust tokenizer decodes every
request's window together, then each request's stop strings are matched. The result is a step
of its own (engine/wire.py's StepColumns, with `texts`), whose rows are the requests the API still
waits for, each with the tokens it keeps, their text and its finish reason.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from ..engine.wire import FINISH_CODE, Extra, StepColumns
from .detokenizer import TextStream
from .tokenizer import Tokenizer

log = logging.getLogger(__name__)

STOP, ERROR = FINISH_CODE["stop"], FINISH_CODE["error"]


class StepDetokenizer:
    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer
        self.streams: dict[int, TextStream] = {}

    def add(
        self, rid: int, prompt_ids: Sequence[int], stop: Sequence[str], skip_special_tokens: bool = True
    ) -> None:
        self.streams[rid] = TextStream(self.tokenizer.for_request(skip_special_tokens), prompt_ids, stop)

    def drop(self, rid: int) -> None:
        self.streams.pop(rid, None)

    def step(self, step: StepColumns) -> tuple[StepColumns, list[int]]:
        """The step with each row's text, rows of requests no longer followed left out; and the
        requests a stop string ended while the engine still generates them (to abort there)."""
        starts, start = [], 0
        for count in step.counts:
            starts.append(start)
            start += count
        # One batch decode for the common row, one token and no text held back: its window "after".
        rows = [i for i, rid in enumerate(step.rids) if rid in self.streams]
        single = [i for i in rows if step.counts[i] == 1 and i not in step.extras]
        windows = {
            i: self.streams[step.rids[i]].detok.windows(step.tokens[starts[i] : starts[i] + 1])
            for i in single
        }
        # One batch per tokenizer: requests that keep their special tokens decode with its twin.
        groups: dict[Tokenizer, list[int]] = {}
        for i in single:
            groups.setdefault(self.streams[step.rids[i]].detok.tokenizer, []).append(i)
        decoded = {}
        for tokenizer, members in groups.items():
            afters = tokenizer.decode_batch([windows[i][1] for i in members])
            for i, after in zip(members, afters, strict=True):
                decoded[i] = (tokenizer.decode(windows[i][0]), after)

        out = StepColumns([], [], [], [], [], step.tokens_at, 0.0, {}, [], step.decode_only)
        aborts: list[int] = []
        for i in rows:
            rid = step.rids[i]
            tokens = step.tokens[starts[i] : starts[i] + step.counts[i]]
            try:
                kept, text, finish, extra = self._row(
                    rid, tokens, step.finish[i], step.extras.get(i), decoded.get(i)
                )
            except Exception as err:  # a bug here fails this request alone, never the process
                log.exception("request %d: detokenizing failed", rid)
                kept, text, finish = [], "", ERROR
                extra = Extra(error=f"the detokenizer failed: {type(err).__name__}: {err}")
            if finish != step.finish[i] and step.finish[i] == 0:
                aborts.append(rid)  # ended here (a stop string, a failure), still running there
            if finish:
                self.drop(rid)
            row = len(out.rids)
            out.rids.append(rid)
            out.counts.append(len(kept))
            out.tokens += kept
            out.finish.append(finish)
            out.cached.append(step.cached[i])
            assert out.texts is not None
            out.texts.append(text)
            if extra is not None:
                out.extras[row] = extra
        return out, aborts

    def _row(
        self, rid: int, tokens: list[int], finish: int, extra: Extra | None, decoded: tuple[str, str] | None
    ) -> tuple[list[int], str, int, Extra | None]:
        """(the tokens the request keeps, their text, its finish code, its extras) for one row."""
        stream = self.streams[rid]
        if extra is not None and extra.error is not None:
            return [], "", finish, extra
        if decoded is not None:  # decoded with the batch: one token
            text, hit = stream.feed(stream.detok.settle(*decoded))
            kept = tokens
        else:  # several tokens (a speculative step), or logprobs to cut with them: one at a time
            text, hit, kept = "", False, []
            for token in tokens:
                kept.append(token)
                piece, hit = stream.push([token])
                text += piece
                if hit:
                    break
        if extra is not None and extra.logprobs is not None:
            extra = Extra(logprobs=extra.logprobs[: len(kept)])
        if hit:
            return kept, text, STOP, extra
        if finish:
            text += stream.finish()  # the end: whatever the detokenizer and stop strings held back
        return kept, text, finish, extra
