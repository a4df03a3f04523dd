"""final/attention/flashinfer_backend.py hands FlashInfer its output buffer: without one, FlashInfer
0.7's prefill `run` allocates it with torch.zeros, one fill kernel per layer that the attention
kernel overwrites anyway. A stand-in wrapper records what `run` was given."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from final.attention.flashinfer_backend import FlashInferBackend


class RecordingWrapper:
    def __init__(self):
        self.calls = []

    def run(self, q, kv, out=None, **kwargs):
        self.calls.append((q, kv, out, kwargs))
        if out is None:  # what FlashInfer does without a buffer
            out = torch.zeros(*q.shape[:-1], kv[1].shape[-1], dtype=q.dtype)
        out.fill_(7.0)  # "the kernel" writes every element
        return out


def backend(head_dim_v: int = 8) -> FlashInferBackend:
    b = object.__new__(FlashInferBackend)  # the library-free parts of the backend only
    b.pool = SimpleNamespace(k=[torch.zeros(4, 2, 2, 8)], v=[torch.zeros(4, 2, 2, head_dim_v)])
    b.scales = [{"k_scale": 1.0}]
    b.prefill_wrapper, b.current = RecordingWrapper(), RecordingWrapper()
    b.write_kv = lambda *args: None
    return b


def test_prefill_and_decode_get_an_empty_buffer_of_the_output_shape():
    for is_prefill in (True, False):
        b = backend()
        q = torch.randn(5, 4, 8, dtype=torch.bfloat16)
        got = b.forward(0, q, None, None, SimpleNamespace(is_prefill=is_prefill))
        wrapper = b.prefill_wrapper if is_prefill else b.current
        ((_, kv, out, kwargs),) = wrapper.calls
        assert out is not None and out.shape == (5, 4, 8) and out.dtype == torch.bfloat16
        assert kv[1] is b.pool.v[0] and kwargs == {"k_scale": 1.0}
        assert got.shape == (5, 32) and got.data_ptr() == out.data_ptr() and bool((got == 7).all())


def test_the_buffer_takes_v_head_dim_not_q_head_dim():
    b = backend(head_dim_v=6)
    q = torch.randn(3, 4, 8)
    b.forward(0, q, None, None, SimpleNamespace(is_prefill=True))
    assert b.prefill_wrapper.calls[0][2].shape == (3, 4, 6)


def test_the_tensor_core_bounds_and_their_ab_switches(tensor_core_bounds, monkeypatch):
    """Decode on tensor cores for a group of 2 (Qwen3-0.6B) from TENSOR_CORE_MIN_BATCH rows and
    TENSOR_CORE_MIN_CONTEXT tokens a row on; FINAL_TC_MIN_BATCH (0: never) and FINAL_TC_MIN_CONTEXT
    (0: any context) override them for gpu_run.sh tc-ab, and a non-number is the user's error.
    Groups of 4 and more always take tensor cores. A size where the context decides gets a decode
    graph for each kernel, and a step replays the one its mean context picks."""
    import pytest

    from final.attention import flashinfer_backend as fb
    from final.core.errors import UserError

    b = object.__new__(FlashInferBackend)
    b.pool = SimpleNamespace(is_fp8=False)
    sizes = (1, 64, 128, 256)

    def switches(group: int, batch: str | None, context: str | None) -> None:
        b.group = group
        tensor_core_bounds(batch, context)

    def picks(group: int, batch: str | None, context: str | None, tokens: float) -> list[bool]:
        switches(group, batch, context)
        return [b.use_tensor_cores(size, tokens) for size in sizes]

    bound, long = fb.TENSOR_CORE_MIN_BATCH, fb.TENSOR_CORE_MIN_CONTEXT
    assert bound is not None and long > 1, "the shipped bounds this test reads"
    assert picks(2, None, None, long) == [s >= bound for s in sizes]
    assert picks(2, None, None, long - 1) == [False] * 4  # a short context: CUDA cores at any batch
    assert picks(2, "128", "0", 1) == [False, False, True, True]
    assert picks(2, "128", "100", 99.5) == [False] * 4
    assert picks(2, "0", None, 8192) == [False] * 4
    assert picks(4, "0", None, 1) == [True] * 4
    # Graphs: one kernel where the context cannot change it, both where it can.
    switches(2, "64", None)
    assert [b.graph_variants(size) for size in sizes] == [
        (False,),
        (False, True),
        (False, True),
        (False, True),
    ]
    step = SimpleNamespace(size=64, seq_lens=[long] * 63 + [1])  # a padded step: the mean decides
    assert b.graph_variant(step) is False
    step.seq_lens[-1] = long
    assert b.graph_variant(step) is True
    switches(2, "64", "0")
    assert b.graph_variants(64) == (True,) and b.graph_variants(8) == (False,)
    switches(4, None, None)
    assert b.graph_variants(8) == (True,)
    # The spread bound (25% as shipped): a step of short, uneven contexts takes tensor cores.
    uneven = SimpleNamespace(size=64, seq_lens=[64, 960] * 32)  # mean 512, spread 87.5%
    even = SimpleNamespace(size=64, seq_lens=[512] * 64)
    switches(2, None, None)
    assert fb.TENSOR_CORE_MIN_SPREAD is not None and b.graph_variant(uneven) is True
    switches(2, "64", "768")
    assert b.graph_variant(even) is False
    tensor_core_bounds("64", "768", "25")
    assert b.graph_variant(uneven) is True and b.graph_variant(even) is False
    uneven.size, uneven.seq_lens = 32, uneven.seq_lens[:32]  # under the batch bound: never
    assert b.graph_variant(uneven) is False
    # ... nor is the spread computed there (a pass over the rows every decode step), nor where the
    # mean context already decides.
    long_even = SimpleNamespace(size=64, seq_lens=[1024] * 64)
    with monkeypatch.context() as m:
        m.setattr(fb, "context_spread", lambda seq_lens: pytest.fail("spread computed"))
        assert b.graph_variant(uneven) is False and b.graph_variant(long_even) is True
    tensor_core_bounds("64", "768", "90")
    assert b.graph_variant(SimpleNamespace(size=64, seq_lens=[64, 960] * 32)) is False
    tensor_core_bounds("64", "768", "0")  # 0: the spread does not count
    assert b.graph_variant(SimpleNamespace(size=64, seq_lens=[64, 960] * 32)) is False
    assert fb.context_spread([512] * 8) == 0 and round(fb.context_spread([64, 960]), 1) == 87.5
    assert fb.context_spread([]) == 0
    with pytest.raises(UserError, match="FINAL_TC_MIN_SPREAD"):
        tensor_core_bounds("64", "768", "high")
        b.graph_variant(even)
    with pytest.raises(UserError, match="FINAL_TC_MIN_BATCH"):
        picks(2, "many", None, 1)
    with pytest.raises(UserError, match="FINAL_TC_MIN_CONTEXT"):
        picks(2, None, "long", 1)


def test_a_given_buffer_is_the_one_run_writes():
    """The piecewise prefill's static output buffer (`out`): FlashInfer's `run` writes there and the
    backend returns it, no buffer of its own."""
    b = backend()
    q = torch.randn(5, 4, 8)
    given = torch.zeros(5, 4, 8)
    got = b.forward(0, q, None, None, SimpleNamespace(is_prefill=True), out=given)
    assert b.prefill_wrapper.calls[0][2] is given
    assert got.data_ptr() == given.data_ptr() and bool((given == 7).all())
