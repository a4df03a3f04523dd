"""The K/V write: the keys and values of a step's T tokens into the paged pool, one kernel a layer.

A layer's pages, flattened, are a table of token slots [slots, kv_heads, head_dim] (slot = page *
page_size + offset in the page). torch writes with `cache[slots] = k`, an index_put: with our
int32 slots it first casts them to int64 (a kernel of its own) and it runs once for K and once
for V, so four kernels a layer where one does. The kernel here reads the int32 slots as they are
and moves one token's K and V per program.

The pool may be narrower than the activations: an fp8 pool (float8_e4m3fn, issue 32) stores
x / scale, saturated to e4m3's largest finite value, with one scale per layer for K and one for V.
Any other pool stores x cast to its dtype (for bf16 into bf16: a copy).

The padding rows of a CUDA-graph step have slots in the pool's padding page, several rows the
same slot: whichever row lands last wins, and no request ever reads that page.
"""

from __future__ import annotations

import functools

import torch

from . import next_power_of_2, use_triton

FP8_E4M3_MAX = 448.0  # the largest finite float8_e4m3fn


# --8<-- [start:quantize]
def quantize(x: torch.Tensor, dtype: torch.dtype, scale: float) -> torch.Tensor:
    """x as the pool stores it: divided by `scale` and saturated for fp8, cast otherwise."""
    if dtype == torch.float8_e4m3fn:
        return (x.float() / scale).clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(dtype)
    return x.to(dtype)


# --8<-- [end:quantize]


def torch_store_kv(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slots: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> None:
    """The reference: k and v [T, kv_heads, head_dim] into rows `slots` [T] of the caches
    [slots, kv_heads, head_dim]."""
    for cache, x, scale in ((k_cache, k, k_scale), (v_cache, v, v_scale)):
        value = quantize(x, cache.dtype, scale)
        if cache.dtype.itemsize == 1:  # fp8: index_put through its bytes (not every build has fp8 kernels)
            cache, value = cache.view(torch.uint8), value.view(torch.uint8)
        cache[slots] = value


@functools.cache
def _jit():
    """The Triton kernel, built on first use (Triton is imported here, not with the module). No
    helper @triton.jit functions: Triton's interpreter (the CPU tests) cannot see closures."""
    import triton
    import triton.language as tl

    @triton.jit
    def store_kv_kernel(
        k_cache,
        v_cache,
        slots,
        k,
        v,
        k_token_stride,
        v_token_stride,
        k_head_stride,
        v_head_stride,
        k_scale,
        v_scale,
        HEADS: tl.constexpr,
        HEAD_DIM: tl.constexpr,
        BLOCK_H: tl.constexpr,
        BLOCK_D: tl.constexpr,
        FP8: tl.constexpr,
    ):
        token = tl.program_id(0).to(tl.int64)
        slot = tl.load(slots + token).to(tl.int64)  # 64-bit offsets: a pool can exceed 2^31 elements
        head = tl.arange(0, BLOCK_H)[:, None]
        dim = tl.arange(0, BLOCK_D)[None, :]
        inside = (head < HEADS) & (dim < HEAD_DIM)
        dst = slot * (HEADS * HEAD_DIM) + head * HEAD_DIM + dim
        key = tl.load(k + token * k_token_stride + head * k_head_stride + dim, mask=inside)
        value = tl.load(v + token * v_token_stride + head * v_head_stride + dim, mask=inside)
        if FP8:  # saturate: e4m3 has no infinity, and a value past 448 would become NaN
            key = tl.minimum(tl.maximum(tl.math.div_rn(key.to(tl.float32), k_scale), -448.0), 448.0)
            value = tl.minimum(tl.maximum(tl.math.div_rn(value.to(tl.float32), v_scale), -448.0), 448.0)
        tl.store(k_cache + dst, key.to(k_cache.dtype.element_ty), mask=inside)
        tl.store(v_cache + dst, value.to(v_cache.dtype.element_ty), mask=inside)

    return store_kv_kernel


def triton_store_kv(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slots: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> None:
    """The kernel, on any k and v whose last dimension is contiguous (a view of the fused qkv
    projection's output is fine); the caches must be contiguous."""
    tokens, heads, head_dim = k.shape
    if tokens == 0:
        return
    assert k_cache.is_contiguous() and v_cache.is_contiguous(), "the pool's layers are contiguous"
    assert k_cache.shape[1:] == k.shape[1:] and v.shape == k.shape, (k_cache.shape, k.shape, v.shape)
    if k.stride(-1) != 1:
        k = k.contiguous()
    if v.stride(-1) != 1:
        v = v.contiguous()
    fp8 = k_cache.dtype == torch.float8_e4m3fn
    _jit()[(tokens,)](
        k_cache,
        v_cache,
        slots,
        k,
        v,
        k.stride(0),
        v.stride(0),
        k.stride(1),
        v.stride(1),
        float(k_scale),
        float(v_scale),
        HEADS=heads,
        HEAD_DIM=head_dim,
        BLOCK_H=next_power_of_2(heads),
        BLOCK_D=next_power_of_2(head_dim),
        FP8=fp8,
        num_warps=4 if heads * head_dim >= 1024 else 2,
    )


def store_kv(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slots: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> None:
    """Write k and v [T, kv_heads, head_dim] into rows `slots` [T] (int32 or int64) of one layer's
    caches [slots, kv_heads, head_dim]: the Triton kernel for CUDA half-precision activations,
    the torch reference otherwise."""
    if use_triton(k):
        triton_store_kv(k_cache, v_cache, slots, k, v, k_scale, v_scale)
    else:
        torch_store_kv(k_cache, v_cache, slots, k, v, k_scale, v_scale)
