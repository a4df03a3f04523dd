"""From the qkv projection to attention's inputs in one kernel a layer: Qwen3's per-head RMSNorm of
q and k (skipped for models without it), RoPE on both, and the write of k and v into the pool.

Op by op that is a norm for q, one for k, a RoPE kernel and the K/V write (four launches and
four round trips of q and k through memory, at decode sizes mostly launch cost). FlashInfer 0.7.2
has no bf16 form of it: `rope.rope_quantize_fp8_append_paged_kv_cache` fuses RoPE and the paged
write but quantizes to fp8 only and has no norm; `norm.fused_qk_rmsnorm_rope` is a video-diffusion
kernel (one norm over all heads, 3-D RoPE, no cache); `norm.rmsnorm` on [tokens, heads, dim] is
the per-head norm alone.

The math, per head of head_dim d, in float32 as the op-by-op path does it:
    x = x * rsqrt(mean(x^2) + eps) * w        (Qwen3; rounded to the activation dtype after, as
                                               the separate norm kernel's output is)
    rotate pairs (i, i + d/2) by the angles of the token's position (neox layout), cos and sin
    read from RotaryEmbedding's float32 table [positions, d] (cos first, sin second half)
    q -> a new [T, heads, d] tensor; k and v -> the pool at the token's slot (kv_write.quantize)

Padding rows of a CUDA-graph step have position 0 and a slot in the padding page: they write
garbage there, which no request reads.

On Hopper, for steps of up to PDL_MAX_TOKENS tokens, it is launched with programmatic dependent
launch (`FINAL_PDL=0` turns it off, as for the GEMV): it may start while the qkv projection ends,
reads the norm weights, waits for that kernel, and lets attention start launching. At batch 1 a
decode step's idle GPU time is mostly the GPU starting each of ~300 graph kernels after the one
before (docs/serving/performance.md), and PDL hides part of it. A large step has no such gaps to
hide, and there the early launch costs: in the H200 kernel table of 2026-11-28
(benchmarks/results/h200/versus_minisgl_fa-fi_h200.json against the same GPU's
versus_minisgl_h200.json of the day before) this kernel took 65% longer at batch 256 under PDL,
where nothing else changed; our reading, not measured apart, is that attention's blocks, launched
early, wait on SMs our 24 × 256 small programs still need. Hence a bound. It was 64 until
`gpu_run.sh pdl-bound` timed whole decode steps with the kernel on PDL and off it (H200, session 16,
benchmarks/results/h200/final_decode_b*_pdl_*_h200.json): at batch 8 the step took 1.57 ms on PDL
against 1.46 off, in two calls with the arms in either order; at batch 64 the two were within 0.3%.
At batch 1 PDL is what the served step was measured with (the GEMV's and this kernel's together
took it from 1.17 to 1.03 ms, `pdl-ab`). Session 17's `pdl-bound` timed batches 2 and 4: at 2 the
step took 1.12 ms on PDL against 1.19 off, at 4 1.31 against 1.28, so the bound is 2
(`FINAL_PDL_MAX_TOKENS` moves it).
"""

from __future__ import annotations

import functools
import os

import torch

from . import next_power_of_2, use_pdl, use_triton
from .kv_write import torch_store_kv

SMALL_STEP_TOKENS = 256  # up to here each program takes one head: many small programs fill the GPU
PDL_MAX_TOKENS = 2  # steps up to here launch with PDL (docstring); FINAL_PDL_MAX_TOKENS overrides


@functools.cache
def pdl_max_tokens() -> int:
    """Read once: an environment lookup per layer would add to the eager prefill's host launch."""
    return int(os.environ.get("FINAL_PDL_MAX_TOKENS", PDL_MAX_TOKENS))


def torch_rms_norm_heads(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    x32 = x.float()
    normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps) * weight.float()
    return normed.to(x.dtype)


def torch_rope_neox(x: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor) -> torch.Tensor:
    cos, sin = cos_sin[positions].unsqueeze(1).chunk(2, dim=-1)
    first, second = x.float().chunk(2, dim=-1)
    return torch.cat([first * cos - second * sin, second * cos + first * sin], dim=-1).to(x.dtype)


def torch_qk_norm_rope_kv(
    qkv: torch.Tensor,
    num_q_heads: int,
    num_kv_heads: int,
    positions: torch.Tensor,
    cos_sin: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slots: torch.Tensor,
    q_weight: torch.Tensor | None = None,
    k_weight: torch.Tensor | None = None,
    eps: float = 1e-6,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> torch.Tensor:
    """The reference: q [T, num_q_heads, head_dim] ready for attention; k and v written into the
    caches [slots, num_kv_heads, head_dim] at `slots`."""
    tokens, head_dim = qkv.shape[0], k_cache.shape[-1]
    q_size, kv_size = num_q_heads * head_dim, num_kv_heads * head_dim
    q, k, v = qkv.split([q_size, kv_size, kv_size], dim=-1)
    q = q.reshape(tokens, num_q_heads, head_dim)
    k = k.reshape(tokens, num_kv_heads, head_dim)
    v = v.reshape(tokens, num_kv_heads, head_dim)
    if q_weight is not None and k_weight is not None:
        q, k = torch_rms_norm_heads(q, q_weight, eps), torch_rms_norm_heads(k, k_weight, eps)
    q, k = torch_rope_neox(q, positions, cos_sin), torch_rope_neox(k, positions, cos_sin)
    torch_store_kv(k_cache, v_cache, slots, k, v, k_scale, v_scale)
    return q.contiguous()


@functools.cache
def _jit():
    """The Triton kernel, built on first use. Program (token, block): blocks below the query-head
    count rotate query heads; the others take as many KV heads, and write their K and V."""
    import triton
    import triton.language as tl

    try:
        from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
    except ImportError:  # an older Triton: PDL stays off (pdl_available), the branch never compiles
        gdc_launch_dependents = gdc_wait = None

    @triton.jit
    def fused_qk_norm_rope_store_kv_kernel(
        qkv,
        q_out,
        k_cache,
        v_cache,
        slots,
        positions,
        cos_sin,
        q_weight,
        k_weight,
        qkv_token_stride,
        eps,
        k_scale,
        v_scale,
        NUM_Q_HEADS: tl.constexpr,
        NUM_KV_HEADS: tl.constexpr,
        HEAD_DIM: tl.constexpr,
        BLOCK_HALF: tl.constexpr,
        HEADS: tl.constexpr,
        NORM: tl.constexpr,
        FP8: tl.constexpr,
        PDL: tl.constexpr,  # launched with programmatic dependent launch: wait before reading qkv
    ):
        HALF: tl.constexpr = HEAD_DIM // 2
        Q_BLOCKS: tl.constexpr = (NUM_Q_HEADS + HEADS - 1) // HEADS
        token = tl.program_id(0).to(tl.int64)
        block = tl.program_id(1)
        i = tl.arange(0, BLOCK_HALF)
        i_in = i < HALF
        is_query = block < Q_BLOCKS
        if is_query:
            head = block * HEADS + tl.arange(0, HEADS)
            inside = (head < NUM_Q_HEADS)[:, None] & i_in[None, :]
            weight = q_weight
        else:
            head = (block - Q_BLOCKS) * HEADS + tl.arange(0, HEADS)
            inside = (head < NUM_KV_HEADS)[:, None] & i_in[None, :]
            weight = k_weight
        if NORM:  # the model's weights, which no kernel writes: read while the kernel before ends
            w1 = tl.load(weight + i, mask=i_in, other=0.0).to(tl.float32)[None, :]
            w2 = tl.load(weight + HALF + i, mask=i_in, other=0.0).to(tl.float32)[None, :]
        if PDL:
            # Everything else after the wait: qkv is the projection's output, and positions and
            # slots were written by this step's first kernels. Then attention may start launching.
            gdc_wait()
            gdc_launch_dependents()
        position = tl.load(positions + token).to(tl.int64)
        cos = tl.load(cos_sin + position * HEAD_DIM + i, mask=i_in, other=0.0)[None, :]
        sin = tl.load(cos_sin + position * HEAD_DIM + HALF + i, mask=i_in, other=0.0)[None, :]
        # Keys sit after the NUM_Q_HEADS query heads in a row of qkv.
        column = tl.where(is_query, head, NUM_Q_HEADS + head)[:, None] * HEAD_DIM + i[None, :]
        src = qkv + token * qkv_token_stride + column
        x1 = tl.load(src, mask=inside, other=0.0).to(tl.float32)
        x2 = tl.load(src + HALF, mask=inside, other=0.0).to(tl.float32)
        if NORM:
            inv_rms = tl.math.rsqrt((tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1)) / HEAD_DIM + eps)
            # Rounded to the activation dtype, as the separate norm kernel's output would be.
            x1 = (x1 * inv_rms[:, None] * w1).to(qkv.dtype.element_ty).to(tl.float32)
            x2 = (x2 * inv_rms[:, None] * w2).to(qkv.dtype.element_ty).to(tl.float32)
        out1 = (x1 * cos - x2 * sin).to(qkv.dtype.element_ty)
        out2 = (x2 * cos + x1 * sin).to(qkv.dtype.element_ty)
        if is_query:
            dst = q_out + token * (NUM_Q_HEADS * HEAD_DIM) + head[:, None] * HEAD_DIM + i[None, :]
            tl.store(dst, out1, mask=inside)
            tl.store(dst + HALF, out2, mask=inside)
        else:
            slot = tl.load(slots + token).to(tl.int64)
            row = slot * (NUM_KV_HEADS * HEAD_DIM) + head[:, None] * HEAD_DIM + i[None, :]
            v_src = qkv + token * qkv_token_stride + (NUM_Q_HEADS + NUM_KV_HEADS + head)[:, None] * HEAD_DIM
            v1 = tl.load(v_src + i[None, :], mask=inside, other=0.0)
            v2 = tl.load(v_src + HALF + i[None, :], mask=inside, other=0.0)
            if FP8:  # kv_write.quantize: divide by the layer's scale, saturate at e4m3's 448
                k1 = tl.minimum(tl.maximum(tl.math.div_rn(out1.to(tl.float32), k_scale), -448.0), 448.0)
                k2 = tl.minimum(tl.maximum(tl.math.div_rn(out2.to(tl.float32), k_scale), -448.0), 448.0)
                v1 = tl.minimum(tl.maximum(tl.math.div_rn(v1.to(tl.float32), v_scale), -448.0), 448.0)
                v2 = tl.minimum(tl.maximum(tl.math.div_rn(v2.to(tl.float32), v_scale), -448.0), 448.0)
            else:
                k1, k2 = out1, out2
            tl.store(k_cache + row, k1.to(k_cache.dtype.element_ty), mask=inside)
            tl.store(k_cache + row + HALF, k2.to(k_cache.dtype.element_ty), mask=inside)
            tl.store(v_cache + row, v1.to(v_cache.dtype.element_ty), mask=inside)
            tl.store(v_cache + row + HALF, v2.to(v_cache.dtype.element_ty), mask=inside)

    return fused_qk_norm_rope_store_kv_kernel


def triton_qk_norm_rope_kv(
    qkv: torch.Tensor,
    num_q_heads: int,
    num_kv_heads: int,
    positions: torch.Tensor,
    cos_sin: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slots: torch.Tensor,
    q_weight: torch.Tensor | None = None,
    k_weight: torch.Tensor | None = None,
    eps: float = 1e-6,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> torch.Tensor:
    """The kernel; same arguments and result as the reference."""
    tokens, head_dim = qkv.shape[0], k_cache.shape[-1]
    assert head_dim % 2 == 0 and cos_sin.dtype == torch.float32 and cos_sin.shape[-1] == head_dim
    assert qkv.shape[1] == (num_q_heads + 2 * num_kv_heads) * head_dim and qkv.stride(1) == 1
    assert k_cache.is_contiguous() and v_cache.is_contiguous() and k_cache.shape[1] == num_kv_heads
    q = torch.empty(tokens, num_q_heads, head_dim, dtype=qkv.dtype, device=qkv.device)
    if tokens == 0:
        return q
    norm = q_weight is not None and k_weight is not None
    heads = 1 if tokens <= SMALL_STEP_TOKENS else 4
    blocks = -(-num_q_heads // heads) + -(-num_kv_heads // heads)
    pdl = tokens <= pdl_max_tokens() and use_pdl(qkv)
    launch = {"launch_pdl": True} if pdl else {}  # an option only a CUDA launch knows
    _jit()[(tokens, blocks)](
        qkv,
        q,
        k_cache,
        v_cache,
        slots,
        positions,
        cos_sin,
        q_weight if norm else qkv,  # not read without the norm: any pointer will do
        k_weight if norm else qkv,
        qkv.stride(0),
        float(eps),
        float(k_scale),
        float(v_scale),
        NUM_Q_HEADS=num_q_heads,
        NUM_KV_HEADS=num_kv_heads,
        HEAD_DIM=head_dim,
        BLOCK_HALF=next_power_of_2(head_dim // 2),
        HEADS=heads,
        NORM=norm,
        FP8=k_cache.dtype == torch.float8_e4m3fn,
        PDL=pdl,
        num_warps=1 if heads * head_dim <= 256 else 4,
        **launch,
    )
    return q


def available(qkv: torch.Tensor) -> bool:
    """Whether the fused kernel serves these activations (CUDA half precision, Triton installed)."""
    return use_triton(qkv)


def qk_norm_rope_kv(
    qkv: torch.Tensor,
    num_q_heads: int,
    num_kv_heads: int,
    positions: torch.Tensor,
    cos_sin: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slots: torch.Tensor,
    q_weight: torch.Tensor | None = None,
    k_weight: torch.Tensor | None = None,
    eps: float = 1e-6,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> torch.Tensor:
    """q [T, num_q_heads, head_dim] normed (when weights are given) and rotated, from the qkv
    projection's output [T, (num_q_heads + 2 * num_kv_heads) * head_dim]; k (normed, rotated)
    and v written into one layer's caches [slots, num_kv_heads, head_dim] at `slots` [T]."""
    run = triton_qk_norm_rope_kv if available(qkv) else torch_qk_norm_rope_kv
    return run(
        qkv, num_q_heads, num_kv_heads, positions, cos_sin, k_cache, v_cache, slots,
        q_weight, k_weight, eps, k_scale, v_scale,
    )  # fmt: skip
