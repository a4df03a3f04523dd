"""What the offline API returns for a request, in vLLM's shape.

    out.prompt, out.prompt_token_ids          the prompt as given (text, or None) and its ids
    out.outputs[i].text, .token_ids           answer i of n (SamplingParams.n)
    out.outputs[i].finish_reason              "stop" (EOS, a stop token or string) or "length"
    out.outputs[i].cumulative_logprob         sum of the answer's token log-probabilities, and
    out.outputs[i].logprobs                   one {token id: Logprob} per token, when asked for

A RequestOutput also keeps the fields of the stages' RequestOutput (stages/common/outputs.py),
which describe the first answer (`out.text`, `out.token_ids`, `out.prompt_ids`, the timings), so
a script written against a stage runs against final/ unchanged; tests/final/test_final_copies.py
checks that every one of them is here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Logprob:
    """One candidate token's log-probability (vLLM's Logprob): `rank` 1 is the likeliest; None
    when the sampled token is not among the top candidates asked for."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclass
class CompletionOutput:
    """One answer to a request (vLLM's CompletionOutput)."""

    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None = None  # None unless logprobs were asked for
    logprobs: list[dict[int, Logprob]] | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None  # the stop token id that ended it; None for EOS or length

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    prompt_ids: list[int]
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None  # "stop" (EOS, stop token or stop string) or "length"
    logprobs: list[dict[str, Any]] = field(default_factory=list)  # one per token when asked for
    cached_tokens: int = 0  # prompt tokens whose KV came from the prefix cache
    ttft_s: float = 0.0  # time from submission to the first token
    latency_s: float = 0.0  # time from submission to the last token
    token_times: list[float] = field(default_factory=list)  # when each token arrived, from submission
    prompt: str | None = None  # the prompt's text, when it was given as text
    request_id: str = ""
    outputs: list[CompletionOutput] = field(default_factory=list)  # n answers (llm.py fills them)

    @property
    def prompt_token_ids(self) -> list[int]:
        return self.prompt_ids

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def num_cached_tokens(self) -> int:
        return self.cached_tokens

    def completion(self, index: int, stop_token_ids: list[int], token_text: Any = None) -> CompletionOutput:
        """This output as answer `index` of its request; `token_text(id) -> str` fills each
        candidate's decoded_token."""
        logprobs: list[dict[int, Logprob]] | None = None
        cumulative: float | None = None
        if self.logprobs:
            logprobs = [
                _candidates(token, entry, token_text)
                for token, entry in zip(self.token_ids, self.logprobs, strict=True)
            ]
            cumulative = sum(entry["token_logprob"] for entry in self.logprobs)
        last = self.token_ids[-1] if self.token_ids else None
        stopped_by_token = self.finish_reason == "stop" and last in stop_token_ids
        return CompletionOutput(
            index=index,
            text=self.text,
            token_ids=list(self.token_ids),
            cumulative_logprob=cumulative,
            logprobs=logprobs,
            finish_reason=self.finish_reason,
            stop_reason=last if stopped_by_token else None,
        )


def _candidates(token: int, entry: dict[str, Any], token_text: Any) -> dict[int, Logprob]:
    """vLLM's per-token dict: the sampled token first, then the top candidates by rank."""
    ranks = {tid: rank for rank, tid in enumerate(entry["top_ids"], 1)}
    out = {token: Logprob(entry["token_logprob"], ranks.get(token))}
    for tid, value in zip(entry["top_ids"], entry["top_logprobs"], strict=True):
        out.setdefault(tid, Logprob(value, ranks[tid]))
    if token_text is not None:
        for tid, lp in out.items():
            lp.decoded_token = token_text(tid)
    return out
