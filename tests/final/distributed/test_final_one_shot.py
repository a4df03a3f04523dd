"""The one-shot all-reduce's switch and routing (final/distributed/one_shot.py), on the CPU: which
ranks build one, which tensors take it, and that the ranks close it together before leaving the
groups. Its kernel runs on GPUs only (test_final_tp_gpu.py compares TP with it against TP=1)."""

from __future__ import annotations

import torch

from final.distributed import group as group_module
from final.distributed import one_shot
from final.distributed.tp import TPInfo

CUDA, CPU = torch.device("cuda", 0), torch.device("cpu")


def test_only_the_switch_on_one_node_of_gpus_at_a_degree_the_kernel_takes_builds_one(monkeypatch):
    monkeypatch.delenv(one_shot.ENV, raising=False)
    assert not one_shot.wanted(CUDA, 2, 1)  # off unless asked: not measured yet
    monkeypatch.setenv(one_shot.ENV, "1")
    assert one_shot.wanted(CUDA, 2, 1) and one_shot.wanted(CUDA, 8, 1)
    assert not one_shot.wanted(CPU, 2, 1)  # gloo on the CPU: no CUDA IPC
    assert not one_shot.wanted(CUDA, 4, 2)  # CUDA IPC does not cross machines
    assert not one_shot.wanted(CUDA, 3, 1)  # the kernel takes 2, 4, 6 or 8 ranks
    monkeypatch.setenv(one_shot.ENV, "0")
    assert not one_shot.wanted(CUDA, 2, 1)


def unbuilt(max_bytes: int = 1024) -> one_shot.OneShotAllReduce:
    fast = object.__new__(one_shot.OneShotAllReduce)  # no GPU, no FlashInfer: the rule alone
    fast.max_bytes, fast.on = max_bytes, True
    return fast


def test_a_tensor_fits_when_its_dtype_layout_and_size_suit_the_kernel():
    fast = unbuilt(1024)
    assert fast.fits(torch.zeros(8, 64, dtype=torch.bfloat16))  # 1,024 bytes: the largest
    assert fast.fits(torch.zeros(4, dtype=torch.float32))  # 16 bytes
    assert not fast.fits(torch.zeros(8, 65, dtype=torch.bfloat16))  # over the buffer
    assert not fast.fits(torch.zeros(3, dtype=torch.float16))  # 6 bytes: not whole 16-byte packs
    assert not fast.fits(torch.zeros(8, 8, dtype=torch.int32))  # a dtype the kernel lacks
    assert not fast.fits(torch.zeros(8, 16, dtype=torch.bfloat16).t())  # not contiguous
    assert not fast.fits(torch.zeros(0, dtype=torch.bfloat16))
    with fast.paused():  # graphs captured only to be measured: NCCL, whatever fits
        assert not fast.fits(torch.zeros(4, dtype=torch.float32))
    assert fast.fits(torch.zeros(4, dtype=torch.float32))


class FakeOneShot:
    def __init__(self):
        self.calls = []

    def fits(self, x):
        return x.numel() <= 16

    def __call__(self, x):
        self.calls.append(x)
        return x * 2  # "two ranks" of the same part


def test_the_all_reduce_takes_the_one_shot_path_for_tensors_that_fit_and_nccl_for_the_rest(monkeypatch):
    seen = []
    monkeypatch.setattr(torch.distributed, "all_reduce", lambda x, group=None: seen.append(x))
    fast = FakeOneShot()
    tp = TPInfo(rank=0, size=2, group="device group", one_shot=fast)
    small, large = torch.ones(16), torch.ones(17)
    assert torch.equal(tp.all_reduce(small), torch.full((16,), 2.0))  # a new tensor: the one returned
    assert fast.calls == [small] and seen == []
    assert tp.all_reduce(large) is large and seen == [large]  # in place, through NCCL
    assert TPInfo(rank=0, size=2, group="device group").all_reduce(small) is small and len(seen) == 2
    assert TPInfo().all_reduce(small) is small and len(fast.calls) == 1  # one rank: nothing to sum


def test_the_ranks_close_it_together_after_the_barrier_and_not_after_a_loss(monkeypatch):
    order = []
    monkeypatch.setattr(group_module.dist, "is_initialized", lambda: True)
    monkeypatch.setattr(group_module.dist, "get_backend", lambda: "gloo")
    monkeypatch.setattr(group_module.dist, "monitored_barrier", lambda **kw: order.append("barrier"))
    monkeypatch.setattr(group_module.dist, "destroy_process_group", lambda: order.append("destroy"))

    class Closing:
        def close(self):
            order.append("close")

    tp = TPInfo(rank=0, size=2, group="g", cpu_group="c", one_shot=Closing())
    group_module.close_tp(tp)
    assert order == ["barrier", "close", "destroy"]
    order.clear()
    group_module.close_tp(tp, abort=True)  # the others are gone: freeing shared buffers would wait
    assert order == ["destroy"]
