"""Sampling parameters and the sampler: from a batch of logits to a batch of next tokens.

Order of operations (the same as vLLM and SGLang): divide by the temperature, keep the top-k
logits, keep the smallest set of tokens whose probability reaches top-p, drop tokens whose
probability is below min-p times the largest, then draw. Temperature 0 is greedy.

`sample` returns the tokens on the logits' device and the log-probabilities on the host.
`sample_on_device` never makes the host wait for the GPU: the tokens and the log-probability
tensors stay on the device (stage 06 copies them back while the next step runs).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from .devices import to_device, to_host
from .errors import UserError


@dataclass
class SamplingParams:
    temperature: float = 1.0
    top_k: int = -1  # -1 or 0: no top-k
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int | None = None
    max_tokens: int | None = 256  # None: no cap (until EOS or the context is full)
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    logprobs: int | None = None  # None: no logprobs; n >= 0: the sampled token's and the top n

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.validate()

    def validate(self) -> None:
        checks: list[tuple[bool, str]] = [
            (self.temperature >= 0, f"temperature must be >= 0, got {self.temperature}"),
            (
                self.top_k == -1 or self.top_k >= 0,
                f"top_k must be >= 1, or -1 or 0 for no limit, got {self.top_k}",
            ),
            (0 < self.top_p <= 1, f"top_p must be in (0, 1], got {self.top_p}"),
            (0 <= self.min_p <= 1, f"min_p must be in [0, 1], got {self.min_p}"),
            (
                self.max_tokens is None or self.max_tokens >= 1,
                f"max_tokens must be >= 1 (or None: no cap), got {self.max_tokens}",
            ),
            (self.logprobs is None or self.logprobs >= 0, f"logprobs must be >= 0, got {self.logprobs}"),
        ]
        for ok, message in checks:
            if not ok:
                raise UserError(message)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0 or self.top_k == 1

    def make_generator(self, device: torch.device | str) -> torch.Generator | None:
        """A private random stream for a seeded request, so its output does not depend on what
        else is in the batch; unseeded requests share the global stream."""
        if self.seed is None:
            return None
        gen = torch.Generator(device=device)
        gen.manual_seed(self.seed)
        return gen


@dataclass
class SampleOutput:
    tokens: torch.Tensor  # [batch] int64, on the logits' device
    logprobs: list[dict[str, Any] | None]  # per row: {"token_logprob", "top_ids", "top_logprobs"}


def top_k_mask(logits: torch.Tensor, top_k: torch.Tensor) -> torch.Tensor:
    """Set all but the k largest logits of each row to -inf (k <= 0 keeps everything)."""
    vocab = logits.shape[-1]
    k = torch.where(top_k <= 0, vocab, top_k).clamp(max=vocab).to(torch.long)
    kth = logits.sort(dim=-1, descending=True).values.gather(-1, (k - 1).unsqueeze(-1))
    return logits.masked_fill(logits < kth, float("-inf"))


def top_p_mask(logits: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose probability sum reaches p."""
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    probs = sorted_logits.softmax(dim=-1)
    before = probs.cumsum(dim=-1) - probs  # probability mass strictly before each token
    drop_sorted = before >= top_p.unsqueeze(-1)
    # The most likely token always survives, even a top_p that float32 rounds to 0 (1e-300).
    drop_sorted[..., 0] = False
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


def min_p_mask(logits: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """Drop tokens whose probability is below min_p times the probability of the likeliest."""
    probs = logits.softmax(dim=-1)
    threshold = probs.max(dim=-1, keepdim=True).values * min_p.unsqueeze(-1)
    return logits.masked_fill(probs < threshold, float("-inf"))


def sample(
    logits: torch.Tensor,
    params: list[SamplingParams],
    generators: list[torch.Generator | None] | None = None,
) -> SampleOutput:
    """Pick the next token of every row of `logits` [batch, vocab] under that row's parameters."""
    tokens, logprobs = sample_on_device(logits, params, generators)
    return SampleOutput(tokens=tokens, logprobs=logprobs.entries() if logprobs else [None] * len(params))


def sample_on_device(
    logits: torch.Tensor,
    params: list[SamplingParams],
    generators: list[torch.Generator | None] | None = None,
) -> tuple[torch.Tensor, Logprobs | None]:
    """`sample` without a host synchronisation: the tokens [batch], and the log-probabilities the
    requests asked for (None if none did), both still on the logits' device."""
    logits = logits.float()
    greedy_tokens = logits.argmax(dim=-1)
    if all(p.greedy for p in params):
        tokens = greedy_tokens
    else:
        tokens = _draw(logits, params, generators or [None] * len(params))
        is_greedy = to_device([p.greedy for p in params], logits.device, torch.bool)
        tokens = torch.where(is_greedy, greedy_tokens, tokens)
    return tokens, _logprobs(logits, tokens, params)


# --8<-- [start:draw]
def _draw(logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator | None]):
    device = logits.device
    temperature = to_device([p.temperature if not p.greedy else 1.0 for p in params], device, torch.float32)
    scaled = logits / temperature.unsqueeze(-1)
    if any(p.top_k > 1 for p in params):
        scaled = top_k_mask(scaled, to_device([p.top_k for p in params], device))
    if any(p.top_p < 1 for p in params):
        scaled = top_p_mask(scaled, to_device([p.top_p for p in params], device, torch.float32))
    if any(p.min_p > 0 for p in params):
        scaled = min_p_mask(scaled, to_device([p.min_p for p in params], device, torch.float32))
    probs = scaled.softmax(dim=-1)
    # Exponential race (the Gumbel-max trick in another form): argmax(p_i / E_i) with E_i ~ Exp(1)
    # draws token i with probability p_i, needs no normalisation and no per-row multinomial call.
    noise = torch.empty_like(probs).exponential_()
    for row, gen in enumerate(generators):
        if gen is not None:
            noise[row].exponential_(generator=gen)
    return (probs / noise).argmax(dim=-1)


# --8<-- [end:draw]


@dataclass
class Logprobs:
    """The log-probabilities of a batch's sampled tokens, and of each row's top n, as tensors."""

    wanted: list[int | None]  # per row: None (no logprobs) or how many top entries
    chosen: torch.Tensor  # [batch] the sampled token's log-probability
    top_values: torch.Tensor | None  # [batch, max n], largest first
    top_ids: torch.Tensor | None

    def to_host(self) -> Logprobs:
        """Start the copies to pinned host memory (see devices.to_host: read after an event)."""
        top = None if self.top_values is None else (to_host(self.top_values), to_host(self.top_ids))
        return Logprobs(self.wanted, to_host(self.chosen), *(top or (None, None)))

    def entries(self) -> list[dict[str, Any] | None]:
        """Per row: {"token_logprob", "top_ids", "top_logprobs"}, or None (reads the tensors)."""
        chosen = self.chosen.tolist()
        values = self.top_values.tolist() if self.top_values is not None else None
        ids = self.top_ids.tolist() if self.top_ids is not None else None
        out: list[dict[str, Any] | None] = []
        for row, n in enumerate(self.wanted):
            if n is None:
                out.append(None)
                continue
            entry: dict[str, Any] = {"token_logprob": chosen[row], "top_ids": [], "top_logprobs": []}
            if n and ids is not None and values is not None:
                entry["top_ids"], entry["top_logprobs"] = ids[row][:n], values[row][:n]
            out.append(entry)
        return out


def _logprobs(logits: torch.Tensor, tokens: torch.Tensor, params: list[SamplingParams]) -> Logprobs | None:
    wanted = [p.logprobs for p in params]
    if all(n is None for n in wanted):
        return None
    # Log-probabilities of the model's own distribution (before temperature and filters).
    logp = logits.log_softmax(dim=-1)
    top_n = max(n or 0 for n in wanted)
    top_values, top_ids = logp.topk(min(top_n, logp.shape[-1]), dim=-1) if top_n else (None, None)
    chosen = logp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    return Logprobs(wanted, chosen, top_values, top_ids)
