"""One rule each, the same in every stage and in final/: flags spelled out with a "did you mean"
for a near miss, `--max-tokens 0` as no cap, the CPU thread count (with --threads and a start-up
line that says it), overlap off by default on the CPU, and the tensor-parallel aliases."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from final.args import parse_args as final_parse_args
from final.core import devices as final_devices
from final.core.config import EngineConfig
from stages.common import devices as stage_devices
from stages.common.errors import UserError
from stages.common.limits import max_new_tokens
from stages.common.sampling import SamplingParams
from tests import ROOT
from tests.stage_list import STAGES, load


def stage_parse(stage: str, argv: list[str]):
    return load(f"stages.{stage}.__main__").parse_args(["--prompt", "x", *argv])


PARSERS = [(stage, lambda argv, s=stage: stage_parse(s, argv)) for stage in STAGES]
PARSERS.append(("final", final_parse_args))


@pytest.mark.parametrize(("name", "parse"), PARSERS, ids=[p[0] for p in PARSERS])
def test_abbreviations_are_refused_with_the_nearest_flag(name, parse, capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse(["--max-token", "8"])
    assert exit_info.value.code == 2
    assert "unrecognized arguments: --max-token 8; did you mean --max-tokens?" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse(["--temprature", "0.5", "--max-tokns", "3"])
    err = capsys.readouterr().err
    assert (
        "--temprature: did you mean --temperature?" in err
        and "--max-tokns: did you mean --max-tokens?" in err
    )


@pytest.mark.parametrize("stage", STAGES)
def test_max_tokens_0_is_no_cap_in_every_stage(stage):
    from stages.common import cli

    params = cli.sampling_params(stage_parse(stage, ["--max-tokens", "0"]))
    assert params.max_tokens is None
    assert max_new_tokens([1, 2, 3], params, max_context=100, vocab_size=10) == 97  # the room left
    with pytest.raises(UserError, match="max_tokens must be >= 0"):
        cli.sampling_params(stage_parse(stage, ["--max-tokens", "-1"]))


def test_max_tokens_0_is_no_cap_in_final():
    assert final_parse_args(["--max-tokens", "0"]).options.max_tokens == 0  # the server's "no cap"
    with pytest.raises(SystemExit):
        final_parse_args(["--max-tokens", "-1"])
    assert SamplingParams(max_tokens=None).max_tokens is None


def test_stage07_takes_the_tensor_parallel_aliases():
    for flag in ("--tp", "--tp-size", "--tensor-parallel-size"):
        assert stage_parse("07_tensor_parallel", [flag, "3"]).tp == 3
    assert final_parse_args(["--tp-size", "3"]).engine.tp == 3


# ---------------------------------------------------------------------------------------------
# Threads


@pytest.mark.parametrize("devices", [stage_devices, final_devices], ids=["stages", "final"])
def test_the_thread_rule(devices, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)), raising=False)
    assert devices.cpu_threads() == 7  # the usable CPUs, less one
    assert devices.cpu_threads(ranks=2) == 3  # shared among the ranks of a node
    assert devices.cpu_threads(requested=5) == 5  # --threads wins
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0}, raising=False)
    assert devices.cpu_threads() == 1 and devices.cpu_threads(ranks=4) == 1  # never 0
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert devices.cpu_threads() is None  # PyTorch read it; it stands
    assert devices.cpu_threads(requested=3) == 3


def test_final_applies_the_rule_and_says_it(tiny_qwen3_dir, monkeypatch, caplog):
    import logging

    import final

    before = torch.get_num_threads()
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2}, raising=False)
    try:
        with caplog.at_level(logging.INFO):
            final.LLM(str(tiny_qwen3_dir), device="cpu")
        assert torch.get_num_threads() == 2
        assert "CPU: 2 PyTorch threads (3 usable CPUs, one left free; --threads N to change)" in caplog.text
        final.LLM(str(tiny_qwen3_dir), device="cpu", threads=1)
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
    assert EngineConfig(threads=None).threads is None


def test_a_stage_says_its_threads_at_start_up(tiny_llama_dir):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("OMP_NUM_THREADS", None)
    proc = subprocess.run(
        [sys.executable, "-m", "stages.01_naive_generate", "--model", str(tiny_llama_dir), "--device", "cpu",
         "--raw", "--prompt", "The cat", "--max-tokens", "2", "--threads", "1"],
        cwd=ROOT, capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.startswith("[CPU: 1 PyTorch thread (--threads; --threads N to change)]"), proc.stderr


# ---------------------------------------------------------------------------------------------
# Overlap


@pytest.mark.parametrize("stage", ["06_overlap", "07_tensor_parallel"])
def test_overlap_is_off_by_default_on_the_cpu_and_said_so(stage, tiny_qwen3_dir, monkeypatch):
    """As final/'s --overlap auto: nothing runs asynchronously on a CPU."""
    monkeypatch.delenv("STAGE06_DISABLE_OVERLAP", raising=False)
    llm = load(f"stages.{stage}").LLM(str(tiny_qwen3_dir), device="cpu")
    assert not llm.overlap
    assert load(f"stages.{stage}.__main__").overlap_report(llm).startswith("off (the CPU's default")
    from final.engine.resolve import resolve_config

    assert not resolve_config(EngineConfig(model=str(tiny_qwen3_dir), device="cpu")).overlap
