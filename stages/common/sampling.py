"""Sampling parameters and the sampler: from a batch of logits to a batch of next tokens.

Order of operations (the same as vLLM and SGLang): divide by the temperature, keep the top-k
logits, keep the smallest set of tokens whose probability reaches top-p, drop tokens whose
probability is below min-p times the largest, then draw. Temperature 0 is greedy.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from .errors import UserError


@dataclass
class SamplingParams:
    temperature: float = 1.0
    top_k: int = -1  # -1 or 0: no top-k
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int | None = None
    max_tokens: int = 256
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
            (self.max_tokens >= 1, f"max_tokens must be >= 1, got {self.max_tokens}"),
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
    drop_sorted = before >= top_p.unsqueeze(-1)  # the most likely token always survives
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
    logits = logits.float()
    greedy_tokens = logits.argmax(dim=-1)
    if all(p.greedy for p in params):
        tokens = greedy_tokens
    else:
        tokens = _draw(logits, params, generators or [None] * len(params))
        is_greedy = torch.tensor([p.greedy for p in params], device=logits.device)
        tokens = torch.where(is_greedy, greedy_tokens, tokens)
    return SampleOutput(tokens=tokens, logprobs=_logprobs(logits, tokens, params))


# --8<-- [start:draw]
def _draw(logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator | None]):
    device = logits.device
    temperature = torch.tensor([p.temperature if not p.greedy else 1.0 for p in params], device=device)
    scaled = logits / temperature.unsqueeze(-1)
    if any(p.top_k > 1 for p in params):
        scaled = top_k_mask(scaled, torch.tensor([p.top_k for p in params], device=device))
    if any(p.top_p < 1 for p in params):
        scaled = top_p_mask(scaled, torch.tensor([p.top_p for p in params], device=device))
    if any(p.min_p > 0 for p in params):
        scaled = min_p_mask(scaled, torch.tensor([p.min_p for p in params], device=device))
    probs = scaled.softmax(dim=-1)
    # Exponential race (the Gumbel-max trick in another form): argmax(p_i / E_i) with E_i ~ Exp(1)
    # draws token i with probability p_i, needs no normalisation and no per-row multinomial call.
    noise = torch.empty_like(probs).exponential_()
    for row, gen in enumerate(generators):
        if gen is not None:
            noise[row].exponential_(generator=gen)
    return (probs / noise).argmax(dim=-1)


# --8<-- [end:draw]


def _logprobs(logits: torch.Tensor, tokens: torch.Tensor, params: list[SamplingParams]):
    wanted = [p.logprobs for p in params]
    if all(n is None for n in wanted):
        return [None] * len(params)
    # Log-probabilities of the model's own distribution (before temperature and filters).
    logp = logits.log_softmax(dim=-1)
    top_n = max(n or 0 for n in wanted)
    top_values, top_ids = logp.topk(min(top_n, logp.shape[-1]), dim=-1) if top_n else (None, None)
    chosen = logp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1).tolist()
    out: list[dict[str, Any] | None] = []
    for row, n in enumerate(wanted):
        if n is None:
            out.append(None)
            continue
        entry: dict[str, Any] = {"token_logprob": chosen[row], "top_ids": [], "top_logprobs": []}
        if n and top_ids is not None:
            entry["top_ids"] = top_ids[row, :n].tolist()
            entry["top_logprobs"] = top_values[row, :n].tolist()
        out.append(entry)
    return out
