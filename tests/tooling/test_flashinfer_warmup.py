"""scripts/flashinfer_warmup.py on the CPU: which jobs it starts, how it dispatches them, how the
parallel runner reports a failed job, and its refusal without a GPU. (The jobs themselves compile
FlashInfer kernels: `bash scripts/gpu_run.sh fi-warmup` on a GPU host.)"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

import pytest
import torch

from scripts import flashinfer_warmup as warmup


def test_jobs_cover_both_decode_kinds_at_both_head_sizes_and_fp8_only_when_asked():
    names = [job.name for job in warmup.jobs(fp8=False)]
    assert names == [
        "attn:128:2:bf16",
        "attn:128:4:bf16",
        "attn:64:1:bf16",
        "attn:64:4:bf16",
        "fused",
        "sampling",
        "stages",
    ]
    with_fp8 = [job.name for job in warmup.jobs(fp8=True)]
    assert [n for n in with_fp8 if n.endswith(":fp8")] == ["attn:128:2:fp8", "attn:64:4:fp8"]
    assert len(set(with_fp8)) == len(with_fp8)


def test_each_job_name_reaches_its_runner_with_its_shape(monkeypatch):
    calls = []
    monkeypatch.setattr(warmup, "run_attention", lambda *shape: calls.append(("attn", *shape)))
    monkeypatch.setattr(warmup, "run_fused", lambda: calls.append(("fused",)))
    monkeypatch.setattr(warmup, "run_sampling", lambda: calls.append(("sampling",)))
    monkeypatch.setattr(warmup, "run_stages", lambda: calls.append(("stages",)))
    for job in warmup.jobs(fp8=True):
        warmup.run_one(job.name)
    assert calls[0] == ("attn", 128, 2, "bf16") and ("attn", 64, 4, "fp8") in calls
    assert calls[-3:] == [("fused",), ("sampling",), ("stages",)]
    with pytest.raises(SystemExit, match="unknown job 'attn-64'"):
        warmup.run_one("attn-64")


@dataclass(frozen=True)
class ScriptJob(warmup.Job):
    code: str = ""

    def command(self) -> list[str]:
        return [sys.executable, "-c", self.code]


def test_a_failed_job_is_reported_with_its_output_and_the_others_still_finish(capsys):
    selected = [
        ScriptJob("good", "print('fine')"),
        ScriptJob("bad", "import sys; print('nvcc said no'); sys.exit(3)"),
        ScriptJob("also-good", "pass"),
    ]
    assert warmup.run_all(selected) == 1
    out = capsys.readouterr().out
    assert "good: ready" in out and "also-good: ready" in out
    assert "bad: FAILED (exit 3)" in out and "nvcc said no" in out
    assert "2 of 3 jobs" in out
    assert warmup.run_all(selected[:1]) == 0


def test_it_names_the_modules_it_compiled_and_not_those_it_found(tmp_path, capsys):
    found = tmp_path / "cache" / "found.so"
    found.parent.mkdir()
    found.write_bytes(b"")
    os.utime(found, (1e9, 1e9))  # carried in from an earlier machine
    write = f"import pathlib; pathlib.Path({str(tmp_path / 'cache' / 'new_kernel.so')!r}).write_bytes(b'')"
    assert warmup.run_all([ScriptJob("compiles", write)], tmp_path) == 0
    assert "1 kernel modules compiled here" in capsys.readouterr().out.replace("\n", " ")
    assert warmup.built_since(tmp_path, 2e9 - 1) == [] and warmup.built_since(tmp_path, 0) == [
        "found",
        "new_kernel",
    ]


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for a machine without a GPU")
def test_without_a_gpu_it_refuses_in_one_line(capsys):
    assert warmup.main([]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err


def test_the_stages_job_runs_stage_07_to_the_end_on_the_cpu():
    """The job's calls (stage 07's LLM at TP 1, a chunked prompt and a short one) through the torch
    backend: on a GPU the same calls build the stages' FlashInfer kernels."""
    tokens = warmup.run_stages(device="cpu", attn="torch")
    assert [len(t) for t in tokens] == [4, 4]  # both requests ran to their max_tokens
