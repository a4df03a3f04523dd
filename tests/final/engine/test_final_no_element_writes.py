"""No step of final/ writes a Python number into one element of a device tensor.

`table[row] = 0.6` looks free, but PyTorch carries the number to a GPU by a copy from pageable
memory, and such a copy first waits for everything queued on the stream (pytorch/pytorch#188267):
under overlap scheduling, for the whole step in flight, so the GPU then idles while the host
launches the next one. An H100 profile of a 32-request prefill step showed 160 of them, five per
admitted request (the sampler's parameter tables). On the CPU the same write shows as a copy into a
0-dim view from a 0-dim tensor, which a dispatch mode can see; these tests watch for it through
whole runs of the engine and count the sampler's work per admission step.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import final
from final.core.sampling_params import INT32_MAX, SamplingParams
from final.engine.penalties import Penalties
from final.engine.sampler import Sampler
from tests.fixtures.tiny_models import sample_prompts


class DeviceOps(TorchDispatchMode):
    """Every aten op run inside the block, and the element writes among them."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []
        self.element_writes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        if func is torch.ops.aten.copy_.default and args[0].dim() == 0 and args[1].dim() == 0:
            self.element_writes += 1
        return func(*args, **(kwargs or {}))


class FakeKV:
    def __init__(self, row: int):
        self.row = row


class FakeRequest:
    def __init__(self, row: int, params: SamplingParams):
        self.kv, self.params = FakeKV(row), params
        self.prompt_ids, self.output_ids = [1, 2, 3], []


MIXED = [
    SamplingParams(temperature=0.0),
    SamplingParams(temperature=0.6),
    SamplingParams(temperature=0.8, top_k=20, top_p=0.9),
    SamplingParams(temperature=1.2, min_p=0.1),
]


def test_the_detector_sees_an_element_write():
    """The test below can fail: the write it forbids is what this mode counts."""
    table = torch.zeros(4)
    with DeviceOps() as seen:
        table[2] = 0.6
    assert seen.element_writes == 1


def test_binding_a_step_costs_the_same_device_work_for_one_request_or_many():
    def bind(n: int) -> DeviceOps:
        sampler = Sampler(64, torch.device("cpu"), vocab_size=50)
        requests = [FakeRequest(row, MIXED[row % len(MIXED)]) for row in range(n)]
        with DeviceOps() as seen:
            assert sampler.bind(requests) == []
        return seen

    one, many = bind(1), bind(32)
    assert many.element_writes == 0
    assert many.ops == one.ops, "the sampler's device work grew with the requests it admitted"


def test_bound_rows_hold_each_requests_parameters():
    sampler = Sampler(8, torch.device("cpu"), vocab_size=50)
    rows = [6, 1, 4, 3]
    assert sampler.bind([FakeRequest(r, p) for r, p in zip(rows, MIXED, strict=True)]) == []
    index = torch.tensor(rows)
    assert sampler.greedy[index].tolist() == [True, False, False, False]
    assert sampler.temperature[index].tolist() == pytest.approx([1.0, 0.6, 0.8, 1.2])
    assert sampler.top_k[index].tolist() == [INT32_MAX, INT32_MAX, 20, INT32_MAX]
    assert sampler.top_p[index].tolist() == pytest.approx([1.0, 1.0, 0.9, 1.0])
    assert sampler.min_p[index].tolist() == pytest.approx([0.0, 0.0, 0.0, 0.1])
    # Rows no request was bound to keep their neutral values.
    assert sampler.temperature[[0, 2, 5, 7]].tolist() == [1.0] * 4
    assert sampler.top_k[[0, 2, 5, 7]].tolist() == [INT32_MAX] * 4


def test_penalties_are_written_without_element_writes():
    table = Penalties(8, vocab_size=50, device=torch.device("cpu"))
    with DeviceOps() as seen:
        table.admit(
            5, SamplingParams(presence_penalty=0.5, frequency_penalty=0.25, repetition_penalty=1.5), [1], []
        )
        table.admit(5, SamplingParams(), [1], [])  # back to neutral values
        table.admit(2, SamplingParams(repetition_penalty=2.0), [3, 4], [4])
    assert seen.element_writes == 0
    assert table.repetition[[2, 5]].tolist() == [2.0, 1.0]
    assert table.presence[5].item() == 0.0


@pytest.mark.parametrize("overlap", ["on", "off"])
def test_an_engine_run_with_admissions_every_few_steps_writes_no_element(tiny_qwen3_dir, overlap):
    llm = final.LLM(str(tiny_qwen3_dir), device="cpu", dtype="float32", overlap=overlap)
    prompts = sample_prompts(tiny_qwen3_dir, n=12, seed=3)
    params = [dataclasses.replace(MIXED[i % len(MIXED)], max_tokens=6, ignore_eos=True) for i in range(12)]
    params[5] = SamplingParams(max_tokens=6, ignore_eos=True, temperature=0.7, repetition_penalty=1.3)
    done = 0
    with DeviceOps() as seen:
        for step in range(200):
            if step % 2 == 0 and step // 2 < len(prompts):  # a request arrives every other step
                llm.add_request(prompts[step // 2], params[step // 2])
            done += len(llm.step())
            if done == len(prompts) and not llm.core.has_work():
                break
    assert done == len(prompts)
    assert seen.element_writes == 0
