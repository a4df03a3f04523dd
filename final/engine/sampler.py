"""The sampler: from a batch of logits to a batch of next tokens, each row under its own params.

Order of operations (the same as vLLM and SGLang): divide by the temperature, keep the top-k
logits, keep the smallest set of tokens whose probability reaches top-p, drop tokens whose
probability is below min-p times the largest, then draw. Temperature 0 is greedy. An all-greedy
batch (the common serving case) is one argmax, with no sort and no softmax.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..core.sampling_params import SamplingParams


def make_generator(params: SamplingParams, device: torch.device) -> torch.Generator | None:
    """A private random stream for a seeded request, so its output does not depend on what else
    is in the batch; unseeded requests share the global stream."""
    if params.seed is None or params.greedy:
        return None
    gen = torch.Generator(device=device)
    gen.manual_seed(params.seed)
    return gen


@dataclass
class TopLogprobs:
    """Log-probabilities of a step, still on the device: `entries()` copies them to the host."""

    wanted: list[int | None]  # per row: None, or how many top candidates the request asked for
    chosen: torch.Tensor  # [S] logprob of each sampled token
    top_ids: torch.Tensor | None  # [S, max n] or None when no row wants candidates
    top_values: torch.Tensor | None

    def entries(self) -> list[dict[str, Any] | None]:
        chosen = self.chosen.tolist()
        top_ids: list[list[int]] = [[] for _ in self.wanted]
        top_values: list[list[float]] = [[] for _ in self.wanted]
        if self.top_ids is not None and self.top_values is not None:
            top_ids, top_values = self.top_ids.tolist(), self.top_values.tolist()  # one copy each
        return [
            None
            if n is None
            else {
                "token_logprob": chosen[row],
                "top_ids": top_ids[row][:n],
                "top_logprobs": top_values[row][:n],
            }
            for row, n in enumerate(self.wanted)
        ]


@dataclass
class SampleOutput:
    tokens: torch.Tensor  # [batch] int64, on the logits' device
    logprobs: TopLogprobs | None  # None when no request of the batch asked for logprobs


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
    logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator | None]
) -> SampleOutput:
    """Pick the next token of every row of `logits` [batch, vocab] under that row's parameters."""
    logits = logits.float()
    greedy_tokens = logits.argmax(dim=-1)
    if all(p.greedy for p in params):
        tokens = greedy_tokens
    else:
        tokens = _draw(logits, params, generators)
        is_greedy = torch.tensor([p.greedy for p in params], device=logits.device)
        tokens = torch.where(is_greedy, greedy_tokens, tokens)
    return SampleOutput(tokens=tokens, logprobs=_logprobs(logits, tokens, params))


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


def _logprobs(logits: torch.Tensor, tokens: torch.Tensor, params: list[SamplingParams]) -> TopLogprobs | None:
    wanted = [p.logprobs for p in params]
    if all(n is None for n in wanted):
        return None
    # Log-probabilities of the model's own distribution (before temperature and filters).
    logp = logits.log_softmax(dim=-1)
    top_n = max(n or 0 for n in wanted)
    chosen = logp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    if not top_n:
        return TopLogprobs(wanted, chosen, None, None)
    values, ids = logp.topk(min(top_n, logp.shape[-1]), dim=-1)
    return TopLogprobs(wanted, chosen, ids, values)
