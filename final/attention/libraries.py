"""The kernel libraries the attention backends run on, and what each needs (the GPUs, page sizes
and head sizes its kernels take), from the libraries' own checks, cited per record:

- FlashAttention 4 (`flash-attn-4`, `flash_attn.cute`): paged KV on compute capability 9.x and
  10.x/11.x (its interface asserts "paged KV not supported" on 8.x and 12.x); any page size, pages
  of exactly one KV tile (128 tokens for head sizes up to 128) load by TMA, others by cp.async.
- FlashAttention 3 (`flash_attn_interface`, built from hopper/ of the repository): Hopper only;
  "page_block_size can be arbitrary".
- FlashAttention 2 (`flash-attn`): Ampere, Ada and Hopper; "page_block_size must be a multiple
  of 256".
- TRT-LLM kernels in FlashInfer: decode through XQA on 9.x and 12.x and trtllm-gen on 10.x,
  prefill (trtllm-gen only) on 10.x; XQA compiles for 16, 32, 64 or 128 tokens per page, and we
  take the sizes both kernel families serve, 16, 32 and 64.
"""

from __future__ import annotations

from .spec import HeadDims, Library

HOPPER_AND_BLACKWELL = "a Hopper or Blackwell datacenter GPU (compute capability 9.x, 10.x or 11.x)"
FLASH_HEAD_DIMS = HeadDims("8-256 (multiples of 8)", low=8, high=256, multiple=8)

FLASHINFER = Library(
    "FlashInfer",
    "pip install flashinfer-python",
    ("flashinfer",),
    None,
    None,
    "an NVIDIA GPU (compute capability 7.5+)",
)
# https://github.com/Dao-AILab/flash-attention/blob/main/flash_attn/cute/interface.py
FLASH_ATTENTION_4 = Library(
    "FlashAttention 4",
    "pip install flash-attn-4 nvidia-cutlass-dsl quack-kernels",
    ("flash_attn.cute", "cutlass", "quack"),  # cutlass: the CuTe DSL (nvidia-cutlass-dsl)
    (9, 10, 11),
    (9, 10, 11),
    HOPPER_AND_BLACKWELL,
    # Any size runs; 16 is the one its GPU results were measured at (bench-attn, every pair).
    default_page_size=16,
    head_dims=FLASH_HEAD_DIMS,
    head_dims_on=tuple(
        (major, HeadDims("8-128 (multiples of 8) or 256", sizes=(256,), low=8, high=128, multiple=8))
        for major in (10, 11)
    ),
)
# https://github.com/Dao-AILab/flash-attention/blob/main/hopper/flash_attn_interface.py
FLASH_ATTENTION_3 = Library(
    "FlashAttention 3",
    "build flash_attn_3 from hopper/ of Dao-AILab/flash-attention",
    ("flash_attn_interface",),
    (9,),
    (9,),
    "a Hopper GPU (compute capability 9.x)",
    head_dims=FLASH_HEAD_DIMS,
)
# https://github.com/Dao-AILab/flash-attention/blob/main/flash_attn/flash_attn_interface.py
FLASH_ATTENTION_2 = Library(
    "FlashAttention 2",
    "pip install flash-attn",
    ("flash_attn.flash_attn_interface",),
    (8, 9),
    (8, 9),
    "an Ampere, Ada or Hopper GPU (compute capability 8.x or 9.x)",
    page_multiple=256,
    default_page_size=256,
    head_dims=FLASH_HEAD_DIMS,
    page_hint="or install flash-attn-4 (Hopper, Blackwell), which takes any page size",
)
# https://github.com/flashinfer-ai/flashinfer/blob/main/flashinfer/decode.py (backend="auto")
TRTLLM = Library(
    "FlashInfer's TensorRT-LLM kernels",
    "pip install flashinfer-python",
    ("flashinfer",),
    (10,),
    (9, 10, 12),
    "a Hopper or Blackwell GPU (compute capability 9.x, 10.x or 12.x)",
    page_sizes=(16, 32, 64),
    default_page_size=64,  # Mini-SGLang's choice for these kernels; fewer, larger pages
    head_dims=HeadDims("64, 128 or 256", sizes=(64, 128, 256)),
    prefill_note="FlashInfer's TensorRT-LLM prefill kernels (trtllm_batch_context_with_kv_cache) "
    "exist for compute capability 10.x (B200, GB200) only",
)
