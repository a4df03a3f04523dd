"""final/'s attention backends on the CPU, with stand-ins for their libraries
(tests/fixtures/attention_standins.py):

- what each backend refuses, and the one message it gives (page size, compute capability,
  missing package, dtype, head size), and what `auto` picks for each GPU;
- the metadata the FlashAttention and TRT-LLM backends build (block tables, lengths, cumulative
  lengths), against hand-computed values for a ragged batch with a cached prefix, a prompt chunk
  and a decoding request, eager and under CUDA-graph buffers with padding rows;
- their outputs with the kernels replaced by a reference that reads the pages the metadata
  names, against the torch backend, which reads the page table itself;
- whole engines on each backend and hybrid against the torch backend, with radix hits, chunked
  prompts and replayed decode graphs.

tests/final/attention/test_final_gpu_attention.py runs the real kernels on a GPU.
"""

from __future__ import annotations

import dataclasses
import logging
import sys

import pytest
import torch

import final
from final.args import build_parser
from final.attention import registry, support
from final.attention.choose import parse_spec, resolve_attention
from final.attention.fa_backend import FlashAttentionBackend
from final.attention.factory import create_backend
from final.attention.libraries import FLASH_ATTENTION_2, FLASH_ATTENTION_3, FLASH_ATTENTION_4, TRTLLM
from final.attention.torch_backend import TorchBackend
from final.attention.trtllm_backend import TrtllmBackend
from final.core.config import EngineConfig
from final.core.errors import UserError
from final.core.forward_batch import ForwardBatch
from final.core.model_config import ModelConfig
from final.core.sampling_params import SamplingParams
from final.engine.graph import EagerGraph, GraphRunner
from tests.fixtures import attention_standins as standins
from tests.fixtures.paged_batches import (
    attention_config,
    make_batch,
    make_pool_and_table,
    make_qkv,
    scattered_pages,
    write_pages,
)
from tests.fixtures.tiny_models import make_tiny_checkpoint, sample_prompts

HOPPER, BLACKWELL, AMPERE = (9, 0), (10, 0), (8, 6)
BF16 = torch.bfloat16


# Hopper: FlashAttention prefill, TRT-LLM decode; Blackwell 10.x: TRT-LLM. The shipped ranks put
# FlashInfer first until a GPU run has measured these (final/attention/registry.py says why).
INTENDED_RANKS = {"trtllm": 0, "fa": 1, "fi": 2}


def intend_auto(monkeypatch) -> None:
    """The descriptors with the ranks the design intended before fa and trtllm were measured (one
    rank for both phases, fa never decoding): the candidate logic's tests, apart from the table."""
    for name, rank in INTENDED_RANKS.items():
        spec = registry.BACKENDS[name]
        assert spec.auto is not None
        no_decode = {"decode": ()} if name == "fa" else {}
        auto = dataclasses.replace(spec.auto, rank=rank, decode_rank=None, prefill_rank_on=(), **no_decode)
        monkeypatch.setitem(registry.BACKENDS, name, dataclasses.replace(spec, auto=auto))


def resolve(spec, page_size=None, dtype=BF16, device="cuda"):
    return resolve_attention(spec, device, dtype, page_size)


def build_backend(spec: str, config: ModelConfig, pool, table):
    """What the engine does: resolve `--attn spec` for this pool and model, then build it."""
    choice = resolve_attention(spec, pool.k.device, pool.k.dtype, pool.page_size, head_dim=config.head_dim)
    return create_backend(choice, config, pool, table)


# ---------------------------------------------------------------------------------------------
# Refusals: one clear message each


@pytest.mark.parametrize("page_size", [1, 8, 128, 256])
def test_trtllm_refuses_page_sizes_other_than_16_32_64(monkeypatch, page_size):
    standins.install(monkeypatch, HOPPER, "flashinfer", cpu_as_gpu=False)
    with pytest.raises(UserError, match=rf"--page-size 16, 32 or 64; got --page-size {page_size}$"):
        resolve("fi,trtllm", page_size)
    for good in (16, 32, 64):
        assert resolve("fi,trtllm", good).page_size == good


def test_trtllm_sets_its_page_size_when_none_was_chosen_and_says_so(monkeypatch, caplog):
    standins.install(monkeypatch, HOPPER, "fa4", "flashinfer", cpu_as_gpu=False)
    with caplog.at_level(logging.INFO, logger="final"):
        choice = resolve("fa,trtllm")
    assert (choice.names, choice.page_size) == (("fa", "trtllm"), 64)
    assert "page size 64" in caplog.text and "16, 32 or 64" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="final"):
        assert resolve("fi").page_size == 1  # no preference: the finest prefix reuse
    assert "page size" not in caplog.text
    with caplog.at_level(logging.INFO, logger="final"):
        assert resolve("fa").page_size == resolve("fi,fa").page_size == 16  # what fa was measured at
    assert "page size 16, FlashAttention 4's choice" in caplog.text


@pytest.mark.parametrize("spec", ["trtllm", "trtllm,fi", "trtllm,torch"])
def test_trtllm_prefill_on_hopper_is_refused_with_the_hybrids_that_work(monkeypatch, spec):
    standins.install(monkeypatch, HOPPER, "fa4", "flashinfer", cpu_as_gpu=False)
    with pytest.raises(UserError) as err:
        resolve(spec, 16)
    message = str(err.value)
    assert message.startswith("--attn trtllm cannot prefill on this GPU (compute capability 9.0)")
    assert "10.x" in message and "--attn fa,trtllm" in message and "--attn fi,trtllm" in message
    assert "\n" not in message


def test_trtllm_prefills_on_blackwell(monkeypatch):
    standins.install(monkeypatch, BLACKWELL, "flashinfer", cpu_as_gpu=False)
    choice = resolve("trtllm")
    assert (choice.names, choice.page_size, choice.prefill_library) == (("trtllm", "trtllm"), 64, TRTLLM)


def test_trtllm_decode_needs_hopper_or_blackwell(monkeypatch):
    standins.install(monkeypatch, AMPERE, "flashinfer", cpu_as_gpu=False)
    with pytest.raises(UserError, match=r"cannot decode on this GPU \(compute capability 8\.6\)") as err:
        resolve("fi,trtllm", 16)
    assert "Hopper or Blackwell" in str(err.value)


@pytest.mark.parametrize(
    ("spec", "package"),
    [
        ("fa", "pip install flash-attn-4"),
        ("fi,trtllm", "pip install flashinfer-python"),
        ("fi", "flashinfer-python"),
    ],
)
def test_a_missing_package_is_named(monkeypatch, spec, package):
    standins.install(monkeypatch, HOPPER, cpu_as_gpu=False)  # no library installed
    with pytest.raises(UserError, match=package):
        resolve(spec, 16)


def test_flash_attention_4_without_its_cute_dsl_counts_as_missing(monkeypatch):
    intend_auto(monkeypatch)
    standins.install(monkeypatch, HOPPER, "fa4", "flashinfer", cpu_as_gpu=False)
    monkeypatch.setitem(sys.modules, "cutlass", None)  # nvidia-cutlass-dsl missing, or off sys.path
    with pytest.raises(
        UserError, match=r"needs FlashAttention 4 \(module cutlass not found\): pip install flash-attn-4"
    ):
        resolve("fa")
    assert resolve("auto").names == ("fi", "trtllm")  # auto goes on to the next choice


def test_fa_on_a_gpu_flash_attention_4_does_not_serve_names_the_gpus_and_the_alternative(monkeypatch):
    standins.install(monkeypatch, AMPERE, "fa4", cpu_as_gpu=False)
    with pytest.raises(UserError) as err:
        resolve("fa")
    message = str(err.value)
    assert message.startswith(
        "--attn fa cannot prefill on this GPU (compute capability 8.6) with FlashAttention 4"
    )
    assert (
        "Hopper or Blackwell" in message
        and "FlashAttention 2 needs an Ampere, Ada or Hopper GPU (compute capability 8.x or 9.x): pip install flash-attn"
        in message
    )


def test_flash_attention_2_needs_pages_of_a_multiple_of_256(monkeypatch):
    standins.install(monkeypatch, AMPERE, "fa2", cpu_as_gpu=False)
    with pytest.raises(UserError, match="multiple of 256; got --page-size 16; or install flash-attn-4"):
        resolve("fa", 16)
    assert resolve("fa").page_size == 256
    assert resolve("fa", 512).decode_library == FLASH_ATTENTION_2


def test_no_page_size_fits_flash_attention_2_and_trtllm(monkeypatch):
    standins.install(monkeypatch, HOPPER, "fa2", "flashinfer", cpu_as_gpu=False)
    with pytest.raises(UserError, match="no page size suits both FlashAttention 2"):
        resolve("fa,trtllm")


def test_flash_attention_prefers_4_then_3_then_2(monkeypatch):
    standins.install(monkeypatch, HOPPER, "fa2", "fa3", "fa4", cpu_as_gpu=False)
    assert resolve("fa").prefill_library == FLASH_ATTENTION_4
    standins.install(monkeypatch, HOPPER, "fa2", "fa3", cpu_as_gpu=False)
    assert resolve("fa").prefill_library == FLASH_ATTENTION_3
    standins.install(monkeypatch, BLACKWELL, "fa2", "fa3", cpu_as_gpu=False)  # neither runs on 10.x
    with pytest.raises(UserError, match="compute capability 10.0"):
        resolve("fa")


@pytest.mark.parametrize("spec", ["fa", "trtllm", "fi", "torch,fa"])
def test_fast_backends_refuse_the_cpu_and_float32(monkeypatch, spec):
    standins.install(monkeypatch, None, "fa4", "flashinfer", cpu_as_gpu=False)
    name = spec.split(",")[-1]
    with pytest.raises(UserError, match=f"--attn {name} runs on CUDA GPUs only"):
        resolve(spec, 16, torch.float32, device="cpu")
    standins.install(monkeypatch, BLACKWELL, "fa4", "flashinfer", cpu_as_gpu=False)
    with pytest.raises(UserError, match=f"--attn {name} needs --dtype bfloat16 or float16"):
        resolve(spec, 16, torch.float32)


def test_unknown_names_and_shapes_are_refused(monkeypatch):
    standins.install(monkeypatch, HOPPER, "fa4", "flashinfer", cpu_as_gpu=False)
    with pytest.raises(UserError, match="choose from torch, fi, fa, trtllm or auto"):
        resolve("flash")
    with pytest.raises(UserError, match="NAME, PREFILL,DECODE or auto"):
        resolve("fa,fi,trtllm")


def test_the_frontend_checks_without_touching_the_gpu(monkeypatch):
    standins.install(monkeypatch, HOPPER, "flashinfer", cpu_as_gpu=False)

    def no_gpu(device):
        raise AssertionError("the frontend must not query the GPU")

    monkeypatch.setattr(support, "device_capability", no_gpu)
    with pytest.raises(UserError, match="got --page-size 1"):
        resolve_attention("fi,trtllm", "cuda", None, 1, probe_gpu=False)
    # Capability-dependent checks wait for the engine process: trtllm prefill passes here.
    assert resolve_attention("trtllm", "cuda", None, None, probe_gpu=False).page_size == 64
    assert resolve_attention("auto", "cuda", None, None, probe_gpu=False).names == ("fi", "fi")


def test_a_library_that_is_found_but_does_not_import_is_one_message(monkeypatch, tmp_path):
    standins.install(monkeypatch, HOPPER)  # nothing importable...
    monkeypatch.setattr(support, "installed", lambda module: True)  # ...though the files are there
    pool, table = pool_and_table(4)
    with pytest.raises(
        UserError,
        match="--attn fa: FlashAttention 4 is installed but does not import .*pip install flash-attn-4",
    ):
        build_backend("fa", tiny_config(), pool, table)
    with pytest.raises(UserError, match="--attn trtllm needs FlashInfer with its TensorRT-LLM kernels"):
        build_backend("torch,trtllm", tiny_config(64), pool_and_table(16, 64)[0], table)


@pytest.mark.parametrize(
    ("spec", "capability", "head_dim", "needle"),
    [
        ("fa", BLACKWELL, 160, "on compute capability 10.0: FlashAttention 4, head sizes 8-128"),
        ("fa", HOPPER, 260, "head sizes 8-256 .multiples of 8. only; this model's is 260"),
        ("fi,trtllm", HOPPER, 16, "TensorRT-LLM kernels, head sizes 64, 128 or 256 only"),
    ],
)
def test_head_sizes_the_kernels_lack_are_refused(monkeypatch, spec, capability, head_dim, needle):
    standins.install(monkeypatch, capability, "fa4", "flashinfer")
    pool, table = pool_and_table(16, head_dim)
    with pytest.raises(UserError, match=needle):
        build_backend(spec, tiny_config(head_dim), pool, table)


def test_an_unset_page_size_is_valid_and_zero_is_not():
    assert EngineConfig().page_size is None
    with pytest.raises(UserError, match="--page-size must be >= 1"):
        EngineConfig(page_size=0)


# ---------------------------------------------------------------------------------------------
# auto


@pytest.mark.parametrize("capability", [HOPPER, BLACKWELL])
def test_auto_ships_the_table_s_first_candidates(monkeypatch, capability):
    """With every library there, auto is the registry's first pick per phase (whatever the
    benchmarks have put first); without FlashInfer, FlashAttention prefills."""
    standins.install(monkeypatch, capability, "fa4", "flashinfer", cpu_as_gpu=False)
    first = [registry.auto_candidates(phase, capability[0])[0].name for phase in ("prefill", "decode")]
    assert resolve("auto", None).names == tuple(first)
    standins.install(monkeypatch, capability, "fa4", cpu_as_gpu=False)  # no FlashInfer: the next in line
    assert resolve("auto", None).prefill == "fa"


@pytest.mark.parametrize(
    ("capability", "libraries", "page_size", "expected"),
    [
        (HOPPER, ("fa4", "flashinfer"), None, ("fa", "trtllm", 64)),
        (HOPPER, ("fa4", "flashinfer"), 16, ("fa", "trtllm", 16)),
        (HOPPER, ("fa4", "flashinfer"), 1, ("fa", "fi", 1)),  # trtllm does not take 1: FlashInfer
        (HOPPER, ("flashinfer",), None, ("fi", "trtllm", 64)),
        (HOPPER, ("fa4",), None, ("fa", "torch", 16)),
        (HOPPER, ("fa2", "flashinfer"), None, ("fa", "fi", 256)),  # FA2's pages do not suit trtllm
        (HOPPER, (), None, ("torch", "torch", 1)),
        (BLACKWELL, ("fa4", "flashinfer"), None, ("trtllm", "trtllm", 64)),
        (BLACKWELL, ("fa4", "flashinfer"), 128, ("fa", "fi", 128)),
        (AMPERE, ("fa4", "fa2", "flashinfer"), None, ("fi", "fi", 1)),
        ((12, 0), ("fa4", "flashinfer"), None, ("fi", "fi", 1)),
    ],
)
def test_auto_picks_by_compute_capability(monkeypatch, capability, libraries, page_size, expected):
    """The candidate logic over the ranks the design intends once fa and trtllm are measured."""
    intend_auto(monkeypatch)
    standins.install(monkeypatch, capability, *libraries, cpu_as_gpu=False)
    choice = resolve("auto", page_size)
    assert (choice.prefill, choice.decode, choice.page_size) == expected


def test_auto_skips_kernels_without_the_models_head_size(monkeypatch):
    intend_auto(monkeypatch)
    standins.install(monkeypatch, HOPPER, "fa4", "flashinfer", cpu_as_gpu=False)
    choice = resolve_attention("auto", "cuda", BF16, None, head_dim=96)
    assert (choice.names, choice.page_size) == (("fa", "fi"), 16)  # trtllm: 64, 128 or 256 only
    with pytest.raises(UserError, match="head sizes 64, 128 or 256 only; this model's is 96"):
        resolve_attention("fa,trtllm", "cuda", BF16, None, head_dim=96)


def test_auto_on_hopper_prefills_with_flash_attention_and_decodes_with_flashinfer(monkeypatch):
    """The shipped table (registry.py cites the H200's results): fa's prefill, fi's decode at fa's
    page size; FlashInfer alone without FlashAttention 4, and for an FP8 cache, which fa cannot read;
    on Blackwell, where fa was not measured, FlashInfer's prefill stays first."""
    standins.install(monkeypatch, HOPPER, "fa4", "flashinfer", cpu_as_gpu=False)
    choice = resolve("auto")
    assert (choice.prefill, choice.decode, choice.page_size) == ("fa", "fi", 16)
    fp8 = resolve_attention("auto", "cuda", BF16, None, kv_dtype=torch.float8_e4m3fn)
    assert (fp8.prefill, fp8.decode, fp8.page_size) == ("fi", "fi", 1)
    standins.install(monkeypatch, HOPPER, "flashinfer", cpu_as_gpu=False)
    assert resolve("auto").names == ("fi", "fi")
    standins.install(monkeypatch, BLACKWELL, "fa4", "flashinfer", cpu_as_gpu=False)
    assert resolve("auto").names == ("fi", "fi")  # fa was measured on Hopper only


def test_auto_is_torch_on_the_cpu_and_in_float32(monkeypatch):
    standins.install(monkeypatch, HOPPER, "fa4", "flashinfer", cpu_as_gpu=False)
    assert resolve("auto", dtype=torch.float32).names == ("torch", "torch")
    assert resolve("auto", device="cpu").names == ("torch", "torch")


def test_help_says_what_auto_picks():
    text = build_parser().format_help()
    flat = " ".join(text.split())
    assert "Hopper: " in flat and "Blackwell 10.x: " in flat and "other GPUs: fi" in flat
    described = registry.describe_auto()
    for major in registry.named_gpus():
        prefill, decode = (registry.auto_candidates(phase, major)[0].name for phase in ("prefill", "decode"))
        pair = prefill if prefill == decode else f"{prefill},{decode}"
        assert f"{registry.GPU_NAMES[major]}: {pair}" in described, (
            f"--help does not say what auto picks on {major}.x"
        )


# ---------------------------------------------------------------------------------------------
# Building blocks: a pool, a page table, a batch


def tiny_config(head_dim: int = 8) -> ModelConfig:
    return attention_config(head_dim)


def pool_and_table(page_size: int, head_dim: int = 8, num_pages: int = 12):
    return make_pool_and_table(attention_config(head_dim), page_size, num_pages)


# The ragged batch of the hand-computed test, page size 4: request A (row 2) has 7 tokens cached
# (a radix hit and an earlier chunk) and computes 3 more; B (row 0) is a fresh prompt of 6; C
# (row 1) decodes its 13th token. Their pages are scattered over the pool.
PAGES = {2: [7, 3, 9], 0: [5, 1], 1: [2, 8, 6, 4]}
ROWS, QUERY_LENS, SEQ_LENS = [2, 0, 1], [3, 6, 1], [10, 6, 13]


def test_prefill_metadata_matches_hand_computed_values(monkeypatch):
    standins.install(monkeypatch, HOPPER, "fa4")
    pool, table = pool_and_table(4)
    write_pages(table, PAGES)
    backend = FlashAttentionBackend(tiny_config(), pool, table, 4, FLASH_ATTENTION_4)
    backend.prepare(make_batch(table, 4, ROWS, QUERY_LENS, SEQ_LENS))
    m = backend.metadata
    # Width 4 = ceil(13 / 4) pages for the longest request; other rows' spare columns are never read.
    assert m.block_table.tolist() == [[7, 3, 9, 0], [5, 1, 0, 0], [2, 8, 6, 4]]
    assert m.block_table.dtype == torch.int32 and m.block_table.is_contiguous()
    assert m.seq_lens.tolist() == [10, 6, 13]
    assert m.cu_seqlens_q.tolist() == [0, 3, 9, 10] and m.cu_seqlens_k.tolist() == [0, 10, 16, 29]
    assert (m.max_seqlen_q, m.max_seqlen_k) == (6, 13)


def test_decode_metadata_has_no_cumulative_lengths(monkeypatch):
    standins.install(monkeypatch, HOPPER, "flashinfer")
    pool, table = pool_and_table(4)
    write_pages(table, PAGES)
    backend = TrtllmBackend(tiny_config(), pool, table, 4)
    backend.prepare(make_batch(table, 4, [1, 0], [1, 1], [13, 5]))
    m = backend.metadata
    assert m.block_table.tolist() == [[2, 8, 6, 4], [5, 1, 0, 0]]
    assert m.seq_lens.tolist() == [13, 5] and m.max_seqlen_k == 13
    assert m.cu_seqlens_q is None and m.cu_seqlens_k is None


def test_graph_metadata_lives_in_fixed_buffers_and_pads_to_the_padding_page(monkeypatch):
    standins.install(monkeypatch, HOPPER, "fa4")
    pool, table = pool_and_table(4)
    write_pages(table, PAGES)
    backend = FlashAttentionBackend(tiny_config(), pool, table, 4, FLASH_ATTENTION_4)
    pad = table.padding_row
    capture = make_batch(table, 4, [pad] * 4, [1] * 4, [1] * 4)  # what GraphRunner captures on
    backend.prepare_for_capture(capture)
    captured = backend.metadata
    assert captured.block_table.shape == (4, table.table.shape[1])  # the full width, always
    assert captured.max_seqlen_k == table.table.shape[1] * 4
    replay = make_batch(table, 4, [1, 2, pad, pad], [1] * 4, [13, 10, 1, 1])
    replay.seq_lens_t = capture.seq_lens_t  # the runner's static buffer...
    replay.seq_lens_t.copy_(torch.tensor([13, 10, 1, 1], dtype=torch.int32))  # ...refilled
    backend.prepare_for_replay(replay)
    m = backend.metadata
    assert m.block_table.data_ptr() == captured.block_table.data_ptr(), (
        "a replay must read the captured buffer"
    )
    assert m.seq_lens is replay.seq_lens_t
    assert m.block_table[:, :4].tolist() == [
        [2, 8, 6, 4],
        [7, 3, 9, 0],
        [pool.padding_page] * 4,
        [pool.padding_page] * 4,
    ]


# ---------------------------------------------------------------------------------------------
# Outputs, with the kernels replaced by the stand-ins' reference, against the torch backend

VARIANTS = [  # (stand-in, capability, backend, library, page size)
    ("fa4", HOPPER, "fa", FLASH_ATTENTION_4, 1),
    ("fa4", BLACKWELL, "fa", FLASH_ATTENTION_4, 4),
    ("fa3", HOPPER, "fa", FLASH_ATTENTION_3, 3),
    ("fa2", AMPERE, "fa", FLASH_ATTENTION_2, 256),
    ("flashinfer", BLACKWELL, "trtllm", TRTLLM, 16),
]


def build(name, pool, table, library):
    if name == "fa":
        return FlashAttentionBackend(tiny_config(), pool, table, 4, library)
    return TrtllmBackend(tiny_config(), pool, table, 4)


def run_both(backend, reference, batch, seed=1):
    q, k, v = make_qkv(batch, tiny_config(), seed=seed)
    reference.prepare(batch)
    want = reference.forward(0, q, k, v, batch)
    backend.prepare(batch)
    got = backend.forward(0, q, k, v, batch)
    return got, want


@pytest.mark.parametrize(("standin", "capability", "name", "library", "page_size"), VARIANTS)
def test_prefill_and_decode_read_the_right_pages(monkeypatch, standin, capability, name, library, page_size):
    calls = standins.install(monkeypatch, capability, standin)
    seq_lens = [10, 6, 13, 1]
    num_pages = sum(-(-n // page_size) for n in seq_lens) + 3
    pool, table = pool_and_table(page_size, num_pages=num_pages)
    write_pages(table, scattered_pages(page_size, seq_lens, num_pages))
    backend, reference = build(name, pool, table, library), TorchBackend(tiny_config(), pool, table, 4)
    # A cached prefix + a chunk, a fresh prompt, a decoding request, a one-token prompt.
    prefill = make_batch(table, page_size, [0, 1, 2, 3], [3, 6, 1, 1], seq_lens)
    got, want = run_both(backend, reference, prefill)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    decode = make_batch(table, page_size, [2, 0, 3], [1, 1, 1], [13, 10, 1])
    got, want = run_both(backend, reference, decode, seed=2)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert len(calls.log) == 2 and calls.log[0]["kind"] != calls.log[1]["kind"], calls.kinds()


@pytest.mark.parametrize(("standin", "capability", "name", "library", "page_size"), VARIANTS)
def test_graph_decode_reads_the_right_pages_after_each_refill(
    monkeypatch, standin, capability, name, library, page_size
):
    standins.install(monkeypatch, capability, standin)
    seq_lens = [12, 7, 3]
    num_pages = sum(-(-n // page_size) for n in seq_lens) + 2
    pool, table = pool_and_table(page_size, num_pages=num_pages)
    write_pages(table, scattered_pages(page_size, seq_lens, num_pages, seed=3))
    backend, reference = build(name, pool, table, library), TorchBackend(tiny_config(), pool, table, 4)
    pad, size = table.padding_row, 4
    static = make_batch(table, page_size, [pad] * size, [1] * size, [1] * size)
    backend.prepare_for_capture(static)
    for rows, lens in [([0, 1, 2], [12, 7, 3]), ([2, 0], [2, 9]), ([1, 0, 2], [5, 11, 1])]:
        step = make_batch(
            table, page_size, rows + [pad] * (size - len(rows)), [1] * size, lens + [1] * (size - len(rows))
        )
        static.rows.copy_(step.rows)  # what the runner stages into its static buffers
        static.seq_lens_t.copy_(step.seq_lens_t)
        static.out_slots.copy_(step.out_slots)
        replayed = ForwardBatch(**{**vars(static), "seq_lens": step.seq_lens})
        backend.prepare_for_replay(replayed)
        q, k, v = make_qkv(step, tiny_config(), seed=len(rows))
        got = backend.forward(0, q, k, v, replayed)
        real = make_batch(table, page_size, rows, [1] * len(rows), lens)
        reference.prepare(real)
        want = reference.forward(0, q[: len(rows)], k[: len(rows)], v[: len(rows)], real)
        torch.testing.assert_close(got[: len(rows)], want, atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------------------------------------
# Whole engines on the stand-ins against the torch backend


@pytest.fixture(scope="module")
def model_dir_64(tmp_path_factory):
    # Head size 64: one the TRT-LLM kernels are built for.
    return make_tiny_checkpoint(tmp_path_factory.mktemp("attn_standins"), "qwen3", head_dim=64)


def drive(llm: final.LLM, prompts, params, arrivals) -> list[final.RequestOutput]:
    rids, outputs, step = {}, {}, 0
    while len(outputs) < len(prompts):
        for i, at in enumerate(arrivals):
            if at == step:
                rids[i] = llm.add_request(prompts[i], params)
        by_rid = {rid: i for i, rid in rids.items()}
        for rid, out in llm.step():
            outputs[by_rid[rid]] = out
        llm.core.check_integrity()
        step += 1
        assert step < 1000
    return [outputs[i] for i in range(len(prompts))]


def with_graphs(llm: final.LLM, max_batch: int) -> list[int]:
    """Decode graphs on the CPU (EagerGraph: a replay reruns the captured step on the static
    buffers); returns a list that counts replays."""
    replays: list[int] = []

    class Counting(EagerGraph):
        def replay(self) -> None:
            replays.append(1)
            super().replay()

    llm.core.executor.graphs = GraphRunner(llm.core.executor.runner, max_batch, Counting)
    return replays


@pytest.mark.parametrize(
    ("spec", "capability", "libraries", "page_size"),
    [
        ("fa", HOPPER, ("fa4",), 4),
        ("fa,trtllm", HOPPER, ("fa4", "flashinfer"), None),  # the page size comes from trtllm: 64
        ("trtllm", BLACKWELL, ("flashinfer",), 16),
        ("torch,fa", HOPPER, ("fa3",), 2),
    ],
)
def test_engine_on_each_backend_equals_the_torch_backend(
    monkeypatch, model_dir_64, spec, capability, libraries, page_size
):
    base = sample_prompts(model_dir_64, n=8, seed=9)
    head = base[1] + base[2]  # 90 tokens: later prompts hit the radix cache, a 64-token page too
    prompts = base + [head] + [head + p[:6] for p in base[3:6]]
    arrivals = [0, 0, 1, 2, 2, 3, 4, 6, 1, 9, 9, 10]
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, logprobs=5)
    kwargs = dict(
        device="cpu", dtype="float32", max_prefill_length=48, max_running_requests=8, num_pages=None
    )
    reference = final.LLM(str(model_dir_64), attn="torch", page_size=page_size or 64, **kwargs)
    want = drive(reference, prompts, params, arrivals)
    calls = standins.install(monkeypatch, capability, *libraries)
    llm = final.LLM(str(model_dir_64), attn=spec, page_size=page_size, **kwargs)
    assert llm.core.config.page_size == (page_size or 64) == llm.core.executor.runner.page_size
    assert llm.engine_config.page_size == page_size, "the user's config is resolved, not rewritten"
    replays = with_graphs(llm, max_batch=8)
    got = drive(llm, prompts, params, arrivals)
    assert replays, "no decode step replayed a graph"
    assert sum(o.cached_tokens for o in got) > 0, "no radix hit"
    prefill, decode = parse_spec(spec)
    expected = {"fa": ("varlen", "batched"), "trtllm": ("context", "decode"), "torch": (None, None)}
    ran = {expected[prefill][0], expected[decode][1]} - {None}
    assert set(calls.kinds()) == ran, f"the kernels that ran: {sorted(set(calls.kinds()))}"
    for g, w in zip(got, want, strict=True):
        assert g.token_ids == w.token_ids
        for a, b in zip(g.logprobs, w.logprobs, strict=True):
            assert a["top_ids"] == b["top_ids"]
            torch.testing.assert_close(
                torch.tensor(a["top_logprobs"]), torch.tensor(b["top_logprobs"]), atol=1e-4, rtol=0
            )
