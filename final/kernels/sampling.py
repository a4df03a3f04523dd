"""Sampling through FlashInfer's kernels, with every row's parameters in device tensors.

The torch reference (engine/sampler.py) sorts the vocabulary for top-p, takes a top-k, builds
masks and an exponential race: a dozen kernels over [rows, vocab] floats. FlashInfer samples by
rejection (https://flashinfer.ai/2025/03/10/sampling.html): each round draws from the row as it
is and raises a probability floor until the draw lands inside the filter, so nothing is sorted.
The chain, in the reference's order:

    probs = softmax(logits / temperature)      flashinfer.sampling.softmax, a temperature per row
    top-k                                      top_k_renorm_probs (then sampling_from_probs if last)
    top-p                                      top_p_renorm_probs, or top_p_sampling_from_probs last
    min-p                                      min_p_sampling_from_probs (always last)
    none of them                               sampling_from_probs

A renorm keeps a filter's survivors and rescales them to sum to one: what the reference's masked
softmax does before the next filter. Min-p compares each probability with the largest one, a
ratio that renormalizing does not change, so it can come last. Each function takes per-row
tensors (temperature float32, top_k int32, top_p and min_p float32); a top_k at or above the
vocabulary keeps every token. The tokens come back as int64, the dtype of the `indices` passed
to the last call (FlashInfer's own output would be int32 and need a cast).

FlashInfer 0.7.2's sampling functions turn bf16 logits into float32 themselves (`logits.float()`
inside `softmax`); nothing else here copies the logits. Random numbers come from torch's default
CUDA generator (FlashInfer advances its Philox offset): a request with its own seed needs the
reference path, because FlashInfer's draw for a row depends on the row's position in the batch.

A batch with no filter at all (temperature alone: the offline workload, most chat traffic) takes
a shorter road, the Gumbel-max trick: argmax over the vocabulary of logits / temperature + g,
with g = -log(-log(u)) for a uniform u per token, is a draw from softmax(logits / temperature)
exactly, without ever writing the probabilities. One Triton kernel reads the bf16 logits once;
FlashInfer's chain for the same draw is the float32 copy, the softmax (reading and writing
[batch, vocab] float32) and a draw over the probabilities: 123 + 169 + 86 us of an H100's batch-256
step (versus_minisgl_h100.json, 2026-11-27), about 5% of it. The vocabulary is cut into chunks,
one program each, so that batch 1 still fills the GPU; a second pass picks each row's best chunk.
The random bits come from Triton's Philox, keyed by a seed that torch's generator draws on the
device every step (so a CUDA graph replays a new draw, and torch.manual_seed reproduces a run).
The kernel reads each row's temperature and greedy flag from the sampler's tables by the row's
page-table row, so a greedy row among the drawn ones is its argmax there, and without the noise the
same two kernels are the greedy batch's argmax (`triton_argmax`): torch's argmax gives a row of the
vocabulary one block of threads, these kernels a program per chunk.
"""

from __future__ import annotations

import functools
from types import ModuleType

import torch

from . import use_triton


@functools.cache
def _flashinfer_sampling() -> ModuleType | None:
    try:
        import flashinfer.sampling
    except ImportError:
        return None
    return flashinfer.sampling


def available(logits: torch.Tensor) -> bool:
    """Whether FlashInfer can sample these logits (CUDA, FlashInfer installed)."""
    return logits.is_cuda and _flashinfer_sampling() is not None


def flashinfer_sample(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor | None,
    top_p: torch.Tensor | None,
    min_p: torch.Tensor | None,
    row_index: torch.Tensor,
) -> torch.Tensor:
    """One token per row of `logits` [S, vocab]; the parameters are [S] tensors, None where no
    row of the batch uses that filter; `row_index` is arange(S) as int64 (the output's dtype)."""
    fi = _flashinfer_sampling()
    assert fi is not None, "check available() first"
    probs = fi.softmax(logits.contiguous(), temperature)  # a vocabulary-padded TP slice is a strided view
    active = [
        (renorm, sample, value)
        for (renorm, sample), value in zip(_filters(fi), (top_k, top_p, min_p), strict=True)
        if value is not None
    ]
    for renorm, _, value in active[:-1]:  # min-p, when present, is last: it needs no renorm
        probs = renorm(probs, value)
    if not active:
        return fi.sampling_from_probs(probs, indices=row_index)
    renorm, sample, value = active[-1]
    if sample is None:  # top-k last: renormalize, then draw from what is left
        return fi.sampling_from_probs(renorm(probs, value), indices=row_index)
    return sample(probs, value, indices=row_index)


def _filters(fi: ModuleType) -> tuple[tuple, tuple, tuple]:
    """(renorm, sample) per filter, in the reference's order: top-k, top-p, min-p."""
    # No top_k_sampling_from_probs: on an H200 (FlashInfer 0.7.2.post1, 2026-11-25) it drew tokens
    # outside the top k (tests/final/kernels/test_final_gpu_kernels.py, top_k=5 alone: several percent of the
    # draws), while top_k_renorm_probs followed by a plain draw keeps to them.
    return (
        (fi.top_k_renorm_probs, None),
        (fi.top_p_renorm_probs, fi.top_p_sampling_from_probs),
        (None, fi.min_p_sampling_from_probs),
    )


# ------------------------------------------------------------------------------------- Gumbel-max

GUMBEL_BLOCK = 2048  # tokens a program reads at a time
GUMBEL_PROGRAMS = 528  # programs to aim for (4 per SM of an H100/H200): more chunks at small batch


def gumbel_chunks(rows: int, vocab: int, block: int) -> tuple[int, int]:
    """(chunks per row, tokens per chunk, a multiple of `block`): enough programs to fill the GPU."""
    blocks = -(-vocab // block)
    chunks = max(1, min(blocks, -(-GUMBEL_PROGRAMS // max(rows, 1))))
    per_chunk = -(-blocks // chunks) * block
    return -(-vocab // per_chunk), per_chunk


def torch_gumbel_sample(
    logits: torch.Tensor, temperature: torch.Tensor, uniforms: torch.Tensor
) -> torch.Tensor:
    """The reference: argmax(logits / temperature - log(-log(u))), u [rows, vocab] in (0, 1), in
    float64 (the kernel's float32 takes care near u = 1: see its comment)."""
    gumbel = -torch.log(-torch.log(uniforms.double()))
    return (logits.double() / temperature.double().unsqueeze(-1) + gumbel).argmax(dim=-1)


PICK_BLOCK = 1024  # chunks the second pass reads at once: more than gumbel_chunks ever makes


def triton_sample(
    logits: torch.Tensor,
    rows: torch.Tensor,
    temperature: torch.Tensor,
    greedy: torch.Tensor,
    seed: torch.Tensor | None,
) -> torch.Tensor:
    """One token per row of `logits` [S, vocab]: row i is request rows[i] (int32, its page-table
    row), whose temperature and greedy flag are `temperature[rows[i]]` and `greedy[rows[i]]` in the
    sampler's tables. A greedy row takes its argmax, the others a Gumbel-max draw keyed by `seed`
    ([1] int64 on the device); `seed` None: every row its argmax, no random numbers drawn (a greedy
    batch). Two kernels: the chunks' bests, then each row's best chunk, written as int64."""
    n, vocab = logits.shape
    if logits.stride(-1) != 1:
        logits = logits.contiguous()
    chunks, per_chunk = gumbel_chunks(n, vocab, GUMBEL_BLOCK)
    assert chunks <= PICK_BLOCK
    best_value = torch.empty(n, chunks, dtype=torch.float32, device=logits.device)
    best_token = torch.empty(n, chunks, dtype=torch.int32, device=logits.device)
    noise = seed is not None
    _gumbel_jit()[(n, chunks)](
        logits, rows, temperature, greedy, seed if noise else rows, best_value, best_token,
        logits.stride(0), vocab, per_chunk, chunks, NOISE=noise, BLOCK=GUMBEL_BLOCK, num_warps=8,
    )  # fmt: skip
    tokens = torch.empty(n, dtype=torch.int64, device=logits.device)
    _pick_jit()[(n,)](best_value, best_token, tokens, chunks, vocab, BLOCK=PICK_BLOCK, num_warps=4)
    return tokens


def triton_gumbel_sample(logits: torch.Tensor, temperature: torch.Tensor, seed: torch.Tensor) -> torch.Tensor:
    """One draw per row of softmax(logits / temperature), logits [rows, vocab] (rows contiguous in
    the vocabulary), temperature [rows] float32 > 0, seed [1] int64 on the device; int64 tokens
    (triton_sample with every row its own table entry, none greedy)."""
    n = logits.shape[0]
    rows = torch.arange(n, dtype=torch.int32, device=logits.device)
    greedy = torch.zeros(n, dtype=torch.bool, device=logits.device)
    return triton_sample(logits, rows, temperature, greedy, seed)


def triton_argmax(logits: torch.Tensor) -> torch.Tensor:
    """Each row's argmax as int64, the first of equal maxima (as torch's): a greedy batch's draw,
    each chunk of the vocabulary read by its own program (torch's argmax gives a row one)."""
    unread = torch.empty(logits.shape[0], dtype=torch.int32, device=logits.device)  # tables, unread: no fill
    return triton_sample(logits, unread, unread, unread, None)


@functools.cache
def _gumbel_jit():
    """The first pass, built on first use (Triton is imported here, not with the module)."""
    import triton
    import triton.language as tl

    # `chunks` changes with the batch: specializing on it (== 1, divisible by 16) would compile a
    # variant in the middle of serving the first time a batch size asked for it.
    @triton.jit(do_not_specialize=["chunks"])
    def gumbel_max_kernel(
        logits,
        rows,
        temperature,
        greedy,
        seed,
        best_value,
        best_token,
        row_stride,
        vocab,
        per_chunk,
        chunks,
        NOISE: tl.constexpr,
        BLOCK: tl.constexpr,
    ):
        row = tl.program_id(0)
        chunk = tl.program_id(1)
        if NOISE:
            table_row = tl.load(rows + row)
            inv_t = 1.0 / tl.load(temperature + table_row)
            keep = tl.load(greedy + table_row) != 0  # a greedy row: its argmax, no noise
            key = tl.load(seed)
        top = tl.full([BLOCK], float("-inf"), tl.float32)
        top_at = tl.zeros([BLOCK], tl.int32)
        start = chunk * per_chunk
        for offset in range(0, per_chunk, BLOCK):
            token = start + offset + tl.arange(0, BLOCK)
            inside = token < vocab
            x = tl.load(logits + row.to(tl.int64) * row_stride + token, mask=inside, other=0.0)
            z = x.to(tl.float32)
            if NOISE:
                # g = -log(E), E = -log(1 - s) an exponential draw, s uniform in (0, 1]. The
                # winners have the smallest E (about 1e-5 over Qwen3's vocabulary), so E must be
                # exact near 0: s from the random bits keeps float32's full precision near 0, and
                # there -log(1 - s) is its series (1 - s would round it away). -log(tl.rand) would
                # give E in steps of float32's spacing below 1 (6e-8), a coarse grid just where the
                # winner is decided. Philox makes four numbers a call: one call per four tokens
                # (tl.randint would throw three away), its four outputs side by side, counters
                # unique per (row, four tokens).
                r0, r1, r2, r3 = tl.randint4x(
                    key, row * vocab + (start + offset) // 4 + tl.arange(0, BLOCK // 4)
                )
                bits = tl.reshape(tl.join(tl.join(r0, r1), tl.join(r2, r3)), [BLOCK]).to(
                    tl.uint32, bitcast=True
                )
                s = (bits.to(tl.float32) + 0.5) * 2.3283064365386963e-10  # (bits + 0.5) / 2^32
                e = tl.where(s < 0.00390625, s + s * s * 0.5 + s * s * s * 0.33333334, -tl.log(1.0 - s))
                z = tl.where(keep, z, z * inv_t - tl.log(e))
            z = tl.where(inside, z, float("-inf"))
            better = z > top
            top = tl.where(better, z, top)
            top_at = tl.where(better, token, top_at)
        value = tl.max(top, axis=0)
        at = tl.min(tl.where(top == value, top_at, vocab), axis=0)  # the first of equals
        tl.store(best_value + row * chunks + chunk, value)
        tl.store(best_token + row * chunks + chunk, at)

    return gumbel_max_kernel


@functools.cache
def _pick_jit():
    """The second pass: each row's best chunk (the first of equals), its token as int64."""
    import triton
    import triton.language as tl

    @triton.jit(do_not_specialize=["chunks"])
    def pick_kernel(best_value, best_token, tokens, chunks, vocab, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        chunk = tl.arange(0, BLOCK)
        inside = chunk < chunks
        value = tl.load(best_value + row * chunks + chunk, mask=inside, other=float("-inf"))
        token = tl.load(best_token + row * chunks + chunk, mask=inside, other=vocab)
        top = tl.max(value, axis=0)
        # Chunks hold ascending token ranges: the smallest token among the best is the first.
        first = tl.min(tl.where(value == top, token, vocab), axis=0)
        tl.store(tokens + row, first.to(tl.int64))

    return pick_kernel


def gumbel_available(logits: torch.Tensor) -> bool:
    """Whether the Gumbel-max kernel serves these logits (CUDA half precision, Triton installed)."""
    return use_triton(logits)


def draw_seed(device: torch.device) -> torch.Tensor:
    """This step's Philox key, drawn by torch's generator on the device (graph-safe)."""
    return torch.randint(0, 2**31 - 1, (1,), device=device, dtype=torch.int64)
