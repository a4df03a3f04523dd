"""The reference sampling filters and draw, in torch: what the sampler (sampler.py) runs on the CPU
and for requests with their own seed, and what the GPU kernels (kernels/sampling.py) are tested
against. Each filter sets the logits it drops to -inf; `draw` then picks one token a row.
"""

from __future__ import annotations

import torch


def top_k_mask(logits: torch.Tensor, top_k: torch.Tensor, max_k: int | None = None) -> torch.Tensor:
    """Set all but the k largest logits of each row to -inf (k <= 0 keeps everything). `max_k`, the
    largest k of the batch when known on the host, lets a partial top-k replace a full sort."""
    vocab = logits.shape[-1]
    k = torch.where(top_k <= 0, vocab, top_k).clamp(max=vocab).to(torch.long)
    if max_k is not None and 0 < max_k < vocab:
        ranked = logits.topk(max_k, dim=-1).values
        k = k.clamp(max=max_k)
    else:
        ranked = logits.sort(dim=-1, descending=True).values
    kth = ranked.gather(-1, (k - 1).unsqueeze(-1))
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


def draw(probs: torch.Tensor, generators: list[torch.Generator | None]) -> torch.Tensor:
    """One token per row of `probs`, from that row's distribution."""
    # Exponential race (the Gumbel-max trick in another form): argmax(p_i / E_i) with E_i ~ Exp(1)
    # draws token i with probability p_i, needs no normalisation and no per-row multinomial call.
    noise = torch.empty_like(probs).exponential_()
    for row, gen in enumerate(generators):
        if gen is not None:  # a seeded request draws from its own stream, whatever its batch
            noise[row].exponential_(generator=gen)
    return (probs / noise).argmax(dim=-1)
