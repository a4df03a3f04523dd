"""scripts/profile_decode_step.py, scripts/kernel_breakdown.py and scripts/render_profile.py: a trace
in, a small JSON out (with the kernels that took the GPU's time), and the chapter's figure and
fragment from the JSON."""

from __future__ import annotations

import json

import pytest

from scripts import kernel_breakdown, render_profile
from scripts import profile_decode_step as profiler
from tests import ROOT


def event(cat: str, name: str, ts: float, dur: float, tid: int = 1) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": tid}


def test_a_gpu_trace_keeps_the_steps_cuda_calls_and_the_gpu_work_after_its_start():
    trace = {
        "traceEvents": [
            event("cuda_runtime", "cudaLaunchKernel", 90, 3),  # before the step: left out
            event("user_annotation", "decode step", 100, 50),
            event("cuda_runtime", "cudaLaunchKernel", 105, 4),
            event("cuda_driver", "cuLaunchKernelEx", 112, 2),
            event("cuda_runtime", "cudaGraphLaunch", 120, 6),
            event("cuda_runtime", "cudaStreamSynchronize", 130, 15),
            event("cpu_op", "aten::mm", 104, 8),  # a GPU trace draws the CUDA calls, not operators
            event("kernel", "gemm", 110, 5, tid=7),
            event("kernel", "attention", 112, 6, tid=7),  # overlaps the first: busy 110..118
            event("gpu_memcpy", "Memcpy DtoH", 140, 2, tid=7),
            event("kernel", "earlier", 95, 2, tid=7),  # before the step: left out
            {"ph": "i", "cat": "kernel", "name": "instant", "ts": 120},  # not a complete event
        ]
    }
    s = profiler.summarise_trace(trace)
    assert s["step_ms"] == pytest.approx(0.05)
    assert [kind for _, _, kind in s["host"]] == ["launch", "launch", "graph", "copy/sync"]
    assert s["host"][0] == [5.0, 4.0, "launch"]
    assert s["launches"] == 3 and s["gpu_kernels"] == 2
    assert s["gpu"] == [[10.0, 5.0], [12.0, 6.0], [40.0, 2.0]]
    assert s["gpu_busy_ms"] == pytest.approx(0.010)  # 8 + 2 microseconds


def test_a_cpu_trace_draws_the_top_level_operators():
    trace = {
        "traceEvents": [
            event("user_annotation", "decode step", 0, 100),
            event("cpu_op", "aten::linear", 10, 30),
            event("cpu_op", "aten::addmm", 12, 20),  # inside aten::linear
            event("cpu_op", "aten::softmax", 50, 10),
        ]
    }
    s = profiler.summarise_trace(trace)
    assert s["host"] == [[10.0, 30.0, "operator"], [50.0, 10.0, "operator"]]
    assert s["gpu"] == [] and s["launches"] == 0


def test_a_trace_without_the_step_annotation_is_refused():
    with pytest.raises(ValueError, match="one 'decode step' annotation"):
        profiler.summarise_trace({"traceEvents": [event("cpu_op", "aten::mm", 0, 1)]})


def test_the_script_profiles_a_tiny_model_on_the_cpu(tmp_path, tiny_qwen3_dir):
    args = ["--model", str(tiny_qwen3_dir), "--device", "cpu", "--dtype", "float32", "--attn", "torch",
            "--batch", "3", "--prompt-len", "12", "--warmup-steps", "1", "--out", str(tmp_path), "--name", "p"]  # fmt: skip
    assert profiler.main(args) == 0
    data = json.loads((tmp_path / "p.json").read_text())
    assert data["kind"] == "decode-step-profile" and data["stand_in"] and data["batch"] == 3
    for mode in ("eager", "graph"):
        m = data["modes"][mode]
        assert m["step_ms"] > 0 and m["host"] and m["gpu"] == []

    # ... and the renderer turns it into the chapter's fragment and figure.
    root = tmp_path / "repo"
    (root / "benchmarks/profiles/cpu").mkdir(parents=True)
    (tmp_path / "p.json").rename(root / "benchmarks/profiles/cpu/p.json")
    render_profile.write_all(root)
    text = (root / render_profile.FRAGMENT).read_text()
    assert "(../assets/profiles/cpu_p.png)" in text and "CPU stand-in" in text
    assert f"step {data['modes']['eager']['step_ms']:.2f} ms" in text
    assert (root / "docs/assets/profiles/cpu_p.png").stat().st_size > 10_000
    assert render_profile.stale_files(root) == []


def test_without_profiles_the_fragment_says_when_they_come(tmp_path):
    render_profile.write_all(tmp_path)
    assert "comes with the next GPU run" in (tmp_path / render_profile.FRAGMENT).read_text()


def test_the_committed_fragment_is_up_to_date():
    assert render_profile.stale_files() == [], "run make docs-gen"


def test_gpu_idle_is_the_windows_gaps_up_to_the_last_gpu_work():
    trace = {
        "traceEvents": [
            event("user_annotation", "decode step", 100, 20),  # the host is done at 120 ...
            event("kernel", "running at the start", 95, 10, tid=7),  # counts from 100: 5 us
            event("kernel", "gemm", 110, 10, tid=7),
            event("gpu_memcpy", "Memcpy DtoH", 125, 5, tid=7),  # ... the GPU at 130
        ]
    }
    s = profiler.summarise_trace(trace)
    assert s["gpu"] == [[0.0, 5.0], [10.0, 10.0], [25.0, 5.0]]
    assert s["gpu_busy_ms"] == pytest.approx(0.020) and s["gpu_idle_ms"] == pytest.approx(0.010)


def test_the_script_profiles_stage06_steps_with_overlap_off_and_on(tmp_path, tiny_qwen3_dir):
    args = ["--stage", "06_overlap", "--steps", "3", "--model", str(tiny_qwen3_dir), "--device", "cpu",
            "--dtype", "float32", "--attn", "torch", "--batch", "2", "--prompt-len", "8", "--warmup-steps", "1",
            "--out", str(tmp_path), "--name", "p"]  # fmt: skip
    assert profiler.main(args) == 0
    data = json.loads((tmp_path / "p.json").read_text())
    assert (
        data["stage"] == "06_overlap" and data["steps"] == 3 and set(data["modes"]) == {"serial", "overlap"}
    )
    root = tmp_path / "repo"
    (root / "benchmarks/profiles/cpu").mkdir(parents=True)
    (tmp_path / "p.json").rename(root / "benchmarks/profiles/cpu/p.json")
    render_profile.write_all(root)
    text = (root / render_profile.FRAGMENTS["06_overlap"]).read_text()
    assert "(../assets/profiles/cpu_p.png)" in text and "overlap on: 3 steps done in" in text
    assert "No decode-step profile yet" in (root / render_profile.FRAGMENT).read_text()
    assert render_profile.stale_files(root) == []


def test_the_script_profiles_final_as_served_and_with_graphs_and_overlap_off(
    tmp_path, tiny_qwen3_dir, monkeypatch
):
    """final/ end to end on the CPU. The engine is watched from outside the script: every launch
    and collect of a step, every replay of a decode graph (the EagerGraph stand-in), and the two
    profiled windows, in one log."""
    from final.engine.core import EngineCore
    from final.engine.graph import EagerGraph

    log: list[str] = []
    uncollected_at_launch: list[tuple[int, int]] = []  # (window, steps launched and not collected)
    window = {"now": 0, "opened": 0, "uncollected": 0}  # now: the window open (0: none)

    def watch(name: str, real):
        def wrapped(self, *args, **kwargs):
            if name == "launch":
                uncollected_at_launch.append((window["now"], window["uncollected"]))
            window["uncollected"] += {"launch": 1, "collect": -1}.get(name, 0)
            log.append(name)
            return real(self, *args, **kwargs)

        return wrapped

    monkeypatch.setattr(EngineCore, "launch", watch("launch", EngineCore.launch))
    monkeypatch.setattr(EngineCore, "collect", watch("collect", EngineCore.collect))
    monkeypatch.setattr(EagerGraph, "replay", watch("replay", EagerGraph.replay))
    real_profile_step = profiler.profile_step

    def profile_step(*args, **kwargs):
        window["opened"] += 1
        window["now"] = window["opened"]
        log.append(f"open {window['now']}")
        try:
            return real_profile_step(*args, **kwargs)
        finally:
            log.append("close")
            window["now"] = 0

    monkeypatch.setattr(profiler, "profile_step", profile_step)
    args = ["--stage", "final", "--steps", "3", "--model", str(tiny_qwen3_dir), "--device", "cpu",
            "--dtype", "float32", "--attn", "torch", "--batch", "2", "--prompt-len", "8", "--warmup-steps", "1",
            "--out", str(tmp_path), "--name", "p"]  # fmt: skip
    assert profiler.main(args) == 0

    data = json.loads((tmp_path / "p.json").read_text())
    assert data["stage"] == "final" and data["steps"] == 3 and data["stand_in"] and data["batch"] == 2
    assert list(data["modes"]) == ["eager_serial", "served"]  # the order they ran and are drawn in
    for mode in data["modes"].values():
        assert mode["step_ms"] > 0 and mode["gpu"] == [] and mode["launches"] == 0
        assert mode["host"] and all(0 <= t <= 1000 * mode["step_ms"] for t, _, _ in mode["host"])

    # What ran in each window: the eager, serial one first, then final/ as it serves.
    first, second = log.index("open 1"), log.index("open 2")
    eager, served = log[first : log.index("close", first)], log[second : log.index("close", second)]
    assert eager.count("launch") == served.count("launch") == 3, "both modes run --steps steps"
    assert eager.count("collect") == served.count("collect") == 3
    assert eager.count("replay") == 0 and served.count("replay") == 3, "served: every decode step replays"
    # Served: each step is launched while the previous one is still uncollected. Serial: never,
    # so the step the overlapped loop left in flight was collected before the switch.
    assert [n for w, n in uncollected_at_launch if w == 2] == [1, 1, 1]
    assert [n for w, n in uncollected_at_launch if w == 1] == [0, 0, 0]

    root = tmp_path / "repo"
    (root / "benchmarks/profiles/cpu").mkdir(parents=True)
    (tmp_path / "p.json").rename(root / "benchmarks/profiles/cpu/p.json")
    render_profile.write_all(root)
    text = (root / render_profile.FRAGMENTS["final"]).read_text()
    assert "(../assets/profiles/cpu_p.png)" in text
    served_ms = render_profile.steps_done_ms(data["modes"]["served"])
    assert f"- as served, CUDA graphs and overlap on: 3 steps done in {served_ms:.2f} ms" in text
    assert "No overlap profile yet" in (root / render_profile.FRAGMENTS["06_overlap"]).read_text()
    assert (root / "docs/assets/profiles/cpu_p.png").stat().st_size > 10_000
    assert render_profile.stale_files(root) == []


def test_without_a_final_profile_its_fragment_names_the_gpu_step(tmp_path):
    render_profile.write_all(tmp_path)
    text = (tmp_path / render_profile.FRAGMENTS["final"]).read_text()
    assert "No final/ profile yet" in text and "gpu_run.sh ckpt profile-final" in text


# ---------------------------------------------------------------------------------------------
# Where the GPU time of a step goes: kernels by short name and category

FILL = "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<{t}>, at::detail::Array<char*, 1> >(int, at::native::FillFunctor<{t}>, at::detail::Array<char*, 1>)"  # fmt: skip
MUL = "void at::native::vectorized_elementwise_kernel<4, at::native::AUnaryFunctor<c10::BFloat16, c10::BFloat16, c10::BFloat16, at::native::binary_internal::MulFunctor<float> >, at::detail::Array<char*, 2> >(int, at::native::AUnaryFunctor<c10::BFloat16, c10::BFloat16, c10::BFloat16, at::native::binary_internal::MulFunctor<float> >, at::detail::Array<char*, 2>)"  # fmt: skip
COPY = "void at::native::elementwise_kernel<128, 4, at::native::gpu_kernel_impl_nocast<at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::operator()() const::{lambda()#12}::operator()() const::{lambda(c10::BFloat16)#1}>(at::TensorIteratorBase&, at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::operator()() const::{lambda()#12}::operator()() const::{lambda(c10::BFloat16)#1} const&)::{lambda(int)#1}>(int, at::native::gpu_kernel_impl_nocast<at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::operator()() const::{lambda()#12}::operator()() const::{lambda(c10::BFloat16)#1}>(at::TensorIteratorBase&, at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::operator()() const::{lambda()#12}::operator()() const::{lambda(c10::BFloat16)#1} const&)::{lambda(int)#1})"  # fmt: skip
INDEX_PUT = "void at::native::index_elementwise_kernel<128, 4, at::native::gpu_index_kernel<at::native::index_put_kernel_impl<at::native::OpaqueType<2> >(at::TensorIterator&, c10::ArrayRef<long>, c10::ArrayRef<long>)::{lambda(char*, char const*, long)#1}>(at::TensorIteratorBase&, c10::ArrayRef<long>, c10::ArrayRef<long>, at::native::index_put_kernel_impl<at::native::OpaqueType<2> >(at::TensorIterator&, c10::ArrayRef<long>, c10::ArrayRef<long>)::{lambda(char*, char const*, long)#1} const&, bool)::{lambda(int)#1}>(long, at::native::gpu_index_kernel<at::native::index_put_kernel_impl<at::native::OpaqueType<2> >(at::TensorIterator&, c10::ArrayRef<long>, c10::ArrayRef<long>)::{lambda(char*, char const*, long)#1}>(at::TensorIteratorBase&, c10::ArrayRef<long>, c10::ArrayRef<long>, at::native::index_put_kernel_impl<at::native::OpaqueType<2> >(at::TensorIterator&, c10::ArrayRef<long>, c10::ArrayRef<long>)::{lambda(char*, char const*, long)#1} const&, bool)::{lambda(int)#1})"  # fmt: skip
ARGMAX = "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::ArgMaxOps<float>, unsigned int, long, 4, 4> >(at::native::ReduceOp<float, at::native::ArgMaxOps<float>, unsigned int, long, 4, 4>)"  # fmt: skip
SILU = "void at::native::vectorized_elementwise_kernel<4, at::native::(anonymous namespace)::silu_kernel(at::TensorIteratorBase&)::{lambda()#1}::operator()() const::{lambda()#4}::operator()() const::{lambda(c10::BFloat16)#1}, at::detail::Array<char*, 2> >(int, at::native::(anonymous namespace)::silu_kernel(at::TensorIteratorBase&)::{lambda()#1}::operator()() const::{lambda()#4}::operator()() const::{lambda(c10::BFloat16)#1}, at::detail::Array<char*, 2>)"  # fmt: skip
GEMV = "std::enable_if<!(false), void>::type internal::gemvx::kernel<int, int, __nv_bfloat16, __nv_bfloat16, __nv_bfloat16, float, false, true, true, false, 7, false, cublasGemvParamsEx<int, cublasGemvTensorStridedBatched<__nv_bfloat16 const>, cublasGemvTensorStridedBatched<__nv_bfloat16 const>, cublasGemvTensorStridedBatched<__nv_bfloat16>, float> >(cublasGemvParamsEx<int, cublasGemvTensorStridedBatched<__nv_bfloat16 const>, cublasGemvTensorStridedBatched<__nv_bfloat16 const>, cublasGemvTensorStridedBatched<__nv_bfloat16>, float>)"  # fmt: skip
DECODE = "void flashinfer::BatchDecodeWithPagedKVCacheKernel<(flashinfer::PosEncodingMode)0, 2u, 4u, 8u, 16u, 1u, 8u, flashinfer::DefaultAttention<false, false, false, false>>(flashinfer::BatchDecodeParams<__nv_bfloat16, __nv_bfloat16, __nv_bfloat16, int>)"  # fmt: skip
ADD_NORM = "void flashinfer::norm::FusedAddRMSNormKernel<8u, __nv_bfloat16>(__nv_bfloat16*, __nv_bfloat16*, __nv_bfloat16*, unsigned int, unsigned int, unsigned int, float, float)"  # fmt: skip
ROPE = "void flashinfer::BatchQKApplyRotaryPosIdsCosSinCacheKernel<true, 128u, 8u, 16u, __nv_bfloat16, long>(__nv_bfloat16*, __nv_bfloat16*, __nv_bfloat16*, __nv_bfloat16*, float*, long*, unsigned int, unsigned int)"  # fmt: skip
ACT = "void flashinfer::activation::act_and_mul_kernel<__nv_bfloat16, &(float silu<float>(float const&))>(__nv_bfloat16*, __nv_bfloat16 const*, int)"  # fmt: skip
APPEND = "void flashinfer::AppendPagedKVCacheKernel<128u, 8u, __nv_bfloat16, int>(flashinfer::paged_kv_t<__nv_bfloat16, int>, __nv_bfloat16*, __nv_bfloat16*, int*, int*, unsigned int)"  # fmt: skip
NVJET = "nvjet_tst_64x8_64x16_4x1_v_bz_splitK_TNT"

KNOWN_KERNELS = [  # (name in a trace, short name, category)
    (FILL.format(t="float"), "vectorized_elementwise_kernel (FillFunctor)", "copy/index"),
    (MUL, "vectorized_elementwise_kernel (MulFunctor)", "elementwise"),
    (COPY, "elementwise_kernel (direct_copy_kernel_cuda)", "copy/index"),
    (INDEX_PUT, "index_elementwise_kernel (index_put_kernel_impl)", "kv-store"),  # the pool's store
    (ARGMAX, "reduce_kernel (ArgMaxOps)", "sampling"),  # greedy sampling
    (SILU, "vectorized_elementwise_kernel (silu_kernel)", "activation"),
    (GEMV, "internal::gemvx::kernel", "gemm"),  # the return type is not the name
    (NVJET, NVJET, "gemm"),
    (
        "void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_16x16_128x1_tn_align8>(cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_16x16_128x1_tn_align8::Params)",
        "Kernel2 (cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_16x16_128x1_tn_align8)",
        "gemm",
    ),  # fmt: skip
    (DECODE, "BatchDecodeWithPagedKVCacheKernel", "attention"),
    (
        "void flashinfer::PersistentKernel<flashinfer::BlockBatchPagedAttentionPersistent<128u>>(flashinfer::PersistentParams)",
        "PersistentKernel (BlockBatchPagedAttentionPersistent)",
        "attention",
    ),  # fmt: skip
    (ADD_NORM, "FusedAddRMSNormKernel", "norm"),
    # FlashInfer's CuTe-DSL norm: `cutlass` in its name, yet a norm
    (
        "kernel_cutlass_kernel_flashinfernormkernelsrmsnormRMSNormKernel_object_at__tensorptrbf16",
        None,
        "norm",
    ),
    (ROPE, "BatchQKApplyRotaryPosIdsCosSinCacheKernel", "rope"),
    (ACT, "act_and_mul_kernel", "activation"),
    (APPEND, "AppendPagedKVCacheKernel", "kv-store"),
    (
        "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
        "ncclDevKernel_AllReduce_Sum_bf16_RING_LL",
        "nccl",
    ),  # fmt: skip
    ("Memcpy HtoD (Pinned -> Device)", "Memcpy HtoD (Pinned -> Device)", "copy/index"),
    (
        "void (anonymous namespace)::indexSelectSmallIndex<c10::BFloat16, long, unsigned int, 2, 2, -2>(at::cuda::detail::TensorInfo<c10::BFloat16, unsigned int>, long)",
        "indexSelectSmallIndex",
        "copy/index",
    ),  # fmt: skip
    ("triton_poi_fused_add_mul_0", "triton_poi_fused_add_mul_0", "elementwise"),
    # final/kernels' Triton kernels, by their function names
    ("store_kv_kernel", "store_kv_kernel", "kv-store"),
    ("fused_qk_norm_rope_store_kv_kernel", "fused_qk_norm_rope_store_kv_kernel", "kv-store"),
    ("gemv_kernel", "gemv_kernel", "gemm"),
    ("decode_inputs_kernel", "decode_inputs_kernel", "copy/index"),
    ("kv_indices_kernel", "kv_indices_kernel", "copy/index"),
    ("gumbel_max_kernel", "gumbel_max_kernel", "sampling"),
    ("pick_kernel", "pick_kernel", "sampling"),
    ("void my_own_kernel<3>(float*)", "my_own_kernel", "other"),
]


@pytest.mark.parametrize("name,short,category", KNOWN_KERNELS)
def test_a_kernels_short_name_and_category(name, short, category):
    shown, qualified = kernel_breakdown.short_name(name)
    assert shown == (short or name)
    assert kernel_breakdown.category(qualified) == category
    assert category in kernel_breakdown.CATEGORIES


def test_the_breakdown_groups_by_short_name_per_step_and_keeps_the_top_and_the_rest():
    work = [  # two steps' GPU work, microseconds
        (NVJET, 30.0), (NVJET, 30.0), (NVJET, 20.0), (NVJET, 20.0),
        (DECODE, 15.0), (DECODE, 15.0),
        (FILL.format(t="float"), 1.0), (FILL.format(t="c10::BFloat16"), 4.0),  # one kernel, two types
        (ADD_NORM, 2.0), (ADD_NORM, 2.0),
        (MUL, 2.0),
        ("Memcpy DtoH (Device -> Pinned)", 1.0),
    ]  # fmt: skip
    b = kernel_breakdown.breakdown(work, steps=2, busy_us=125.0, top=3)
    assert b["busy_us"] == 62.5
    assert b["top"] == [
        {"name": NVJET, "category": "gemm", "count": 2.0, "us": 50.0, "share": 0.8},
        {"name": "BatchDecodeWithPagedKVCacheKernel", "category": "attention", "count": 1.0, "us": 15.0, "share": 0.24},
        {"name": "vectorized_elementwise_kernel (FillFunctor)", "category": "copy/index", "count": 1.0, "us": 2.5, "share": 0.04},
    ]  # fmt: skip
    # norm (4 us), MulFunctor (2), the copy (1): three names, 4 launches, 7 us in two steps
    assert b["rest"] == {"names": 3, "count": 2.0, "us": 3.5, "share": 0.056}
    assert b["categories"] == [
        {"category": "gemm", "count": 2.0, "us": 50.0, "share": 0.8},
        {"category": "attention", "count": 1.0, "us": 15.0, "share": 0.24},
        {"category": "copy/index", "count": 1.5, "us": 3.0, "share": 0.048},  # the fills and the memcpy
        {"category": "norm", "count": 1.0, "us": 2.0, "share": 0.032},
        {"category": "elementwise", "count": 0.5, "us": 1.0, "share": 0.016},
    ]
    # every microsecond lands in exactly one category and in the top or the rest
    assert sum(c["us"] for c in b["categories"]) == pytest.approx(71.0)
    assert sum(k["us"] for k in b["top"]) + b["rest"]["us"] == pytest.approx(71.0)


def test_a_gpu_trace_records_its_kernels_by_name_per_step_and_a_cpu_trace_none():
    trace = {
        "traceEvents": [
            event("user_annotation", "decode step", 100, 50),
            event("kernel", DECODE, 95, 10, tid=7),  # running when the window opens: counts from 100
            event("kernel", NVJET, 105, 20, tid=7),
            event("kernel", NVJET, 125, 20, tid=7),
            event("gpu_memcpy", "Memcpy DtoH (Device -> Pinned)", 145, 5, tid=7),
            event("kernel", ADD_NORM, 80, 5, tid=7),  # before the window: left out
        ]
    }
    s = profiler.summarise_trace(trace, steps=2)
    k = s["kernels"]
    assert k["busy_us"] == 25.0  # 50 us in two steps
    assert [(r["name"], r["count"], r["us"]) for r in k["top"]] == [
        (NVJET, 1.0, 20.0),
        ("BatchDecodeWithPagedKVCacheKernel", 0.5, 2.5),
        ("Memcpy DtoH (Device -> Pinned)", 0.5, 2.5),
    ]
    assert [c["category"] for c in k["categories"]] == ["gemm", "attention", "copy/index"]
    assert k["rest"]["names"] == 0
    cpu = {
        "traceEvents": [event("user_annotation", "decode step", 0, 100), event("cpu_op", "aten::mm", 10, 30)]
    }
    assert "kernels" not in profiler.summarise_trace(cpu)


def profile_with_kernels(stage: str = "final") -> dict:
    """A final/ profile as a GPU run writes it, with the kernel breakdown in both modes."""
    eager = kernel_breakdown.breakdown(
        [(NVJET, 40.0), (DECODE, 10.0), (COPY, 5.0)], steps=1, busy_us=50.0, top=2
    )
    served = kernel_breakdown.breakdown([(NVJET, 38.0), (DECODE, 10.0)], steps=1, busy_us=48.0, top=2)
    mode = {"step_ms": 0.1, "gpu_busy_ms": 0.05, "gpu_idle_ms": 0.01, "gpu_kernels": 3, "launches": 3,
            "host": [[0.0, 1.0, "launch"]], "gpu": [[1.0, 40.0], [41.0, 10.0]]}  # fmt: skip
    return {
        "kind": "decode-step-profile", "stage": stage, "steps": 1, "model": "m", "device": "NVIDIA H200",
        "stand_in": False, "batch": 1, "prompt_len": 8, "attn": "fi", "dtype": "bfloat16",
        "modes": {"eager_serial": {**mode, "kernels": eager}, "served": {**mode, "kernels": served}},
        "command": "python scripts/profile_decode_step.py --stage final", "timestamp": "2026-01-01T00:00:00Z",
    }  # fmt: skip


def test_the_fragment_shows_where_the_gpu_time_of_a_step_goes(tmp_path):
    root = tmp_path / "repo"
    (root / "benchmarks/profiles/h200").mkdir(parents=True)
    (root / "benchmarks/profiles/h200/final_b1.json").write_text(json.dumps(profile_with_kernels()))
    render_profile.write_all(root)
    text = (root / render_profile.FRAGMENTS["final"]).read_text()
    assert "**Where the GPU time of a step goes**" in text
    assert "| Category | CUDA graphs and overlap off | as served, CUDA graphs and overlap on |" in text
    assert "| gemm | 40.0 µs, 80.0%, 1 kernels | 38.0 µs, 79.2%, 1 kernels |" in text
    assert "| copy/index | 5.0 µs, 10.0%, 1 kernels | - |" in text  # only eager copies
    assert "| busy (overlaps once) | 50.0 µs | 48.0 µs |" in text
    assert '??? note "The top kernels of a step, as served, CUDA graphs and overlap on"' in text
    assert f"    | `{NVJET}` | gemm | 1 | 38.0 | 79.2% |" in text
    assert "    | `BatchDecodeWithPagedKVCacheKernel` | attention | 1 | 10.0 | 20.8% |" in text
    assert "everything else" not in text  # served ran two kernels: both in its top 2
    assert text.index("Where the GPU time") < text.index("Measured 2026-01-01")
    assert render_profile.stale_files(root) == []


def test_a_profile_without_kernels_renders_as_before():
    profile = profile_with_kernels()
    for mode in profile["modes"].values():
        del mode["kernels"]
    text = render_profile.render_fragment({"h200/p": profile}, "final")
    assert "Where the GPU time" not in text and "??? note" not in text
    assert "\n\n- CUDA graphs and overlap off: step 0.10 ms" in text
    served = next(line for line in text.splitlines() if line.startswith("- as served"))
    assert served.startswith(
        "- as served, CUDA graphs and overlap on: step 0.10 ms; GPU busy 0.05 ms (50%); 3 launches, 3 kernels. GPU idle"
    )
    assert text.index(served) < text.index("Measured")


def test_idle_is_split_into_before_the_first_kernel_and_between_kernels():
    """Chapter 06 read the overlapped run's idle time as the GPU waiting for the host between
    steps; most of it was before the first kernel and the rest sub-20 µs gaps. The breakdown says
    which: overlapping kernels merge, a gap over 20 µs counts as a wait for the host."""
    mode = {
        "step_ms": 1.2, "gpu_busy_ms": 0.0,  # not read by the breakdown
        # starts (µs from the window's start) and durations: two overlapping kernels, a 15 µs gap,
        # a 65 µs gap
        "gpu": [[1005.0, 10.0], [1000.0, 10.0], [1030.0, 5.0], [1100.0, 5.0]],
    }  # fmt: skip
    idle = render_profile.idle_breakdown(mode)
    assert idle["idle_before_first_ms"] == pytest.approx(1.0)
    assert idle["idle_between_ms"] == pytest.approx(0.080)  # 15 + 65 µs
    assert (idle["gaps"], idle["long_gaps"]) == (2, 1)
    assert idle["long_gap_ms"] == pytest.approx(0.065) and idle["max_gap_us"] == pytest.approx(65.0)
    assert idle["first_to_last_ms"] == pytest.approx(0.105)
    text = render_profile.idle_text(mode, steps=1)
    assert text.startswith(
        "GPU idle 1.00 ms before its first kernel and 0.08 ms between kernels, in 2 gaps: 1 longer"
    )
    assert render_profile.idle_breakdown({"gpu": []}) == {}  # a CPU trace has no GPU lane


def test_the_idle_breakdown_adds_up_to_the_profiles_idle_time():
    """On every committed GPU profile: before the first kernel + between kernels = gpu_idle_ms
    (which profile_decode_step.py computes from unrounded times: the JSON keeps 0.1 µs)."""
    for name, profile in render_profile.load_profiles(ROOT).items():
        for key, mode in profile["modes"].items():
            idle = render_profile.idle_breakdown(mode)
            if idle:
                total = idle["idle_before_first_ms"] + idle["idle_between_ms"]
                assert total == pytest.approx(mode["gpu_idle_ms"], abs=0.05), (name, key)  # 0.1 µs rounding


def test_a_run_of_steps_is_done_when_the_gpu_is():
    """Overlapped, the host leaves its window while the GPU still runs the last step: the run is
    timed to the later of the two (stage 06 on the H200: window 47.87 ms, GPU done at 53.18 ms)."""
    overlapped = {"step_ms": 47.87, "gpu_busy_ms": 42.07, "gpu_idle_ms": 11.11}
    serial = {"step_ms": 77.45, "gpu_busy_ms": 42.05, "gpu_idle_ms": 34.69}
    assert render_profile.steps_done_ms(overlapped) == pytest.approx(53.18)
    assert render_profile.steps_done_ms(serial) == pytest.approx(77.45)
    line = render_profile.summary(overlapped, steps=8)
    assert line.startswith("8 steps done in 53.18 ms (6.65 ms a step; the host's window 47.87 ms)")


def test_a_run_far_shorter_than_the_other_gets_a_panel_on_its_own_axis():
    """final/ as served takes a tenth of its eager, serial run: on their shared axis its graph
    launches and gaps are a few pixels, so it is drawn again on its own axis. Stage 06's two runs
    are of one order and share theirs; a single step gets its zoom instead."""
    profiles = render_profile.load_profiles(ROOT)
    final = next(p for name, p in profiles.items() if name.endswith("final_decode_step_b1_cuda"))
    assert [(key, kind) for key, _, kind in render_profile.panels(final)] == [
        ("eager_serial", "whole"), ("served", "whole"), ("served", "own"),
    ]  # fmt: skip
    stage06 = profiles["h200/stage06_decode_step_b64_cuda"]
    assert [kind for _, _, kind in render_profile.panels(stage06)] == ["whole", "whole"]
    stage05 = profiles["h200/stage05_decode_step_b1_cuda"]
    assert [kind for _, _, kind in render_profile.panels(stage05)] == ["whole", "zoom", "whole", "zoom"]
