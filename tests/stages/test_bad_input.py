"""Every bad input gets one clear line on stderr and exit status 2, never a traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.stage_list import ROOT, STAGES


def run_stage(stage: str, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", f"stages.{stage}", *args],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})},
    )  # fmt: skip


def assert_clean_error(proc: subprocess.CompletedProcess, *needles: str) -> None:
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    # A failure after the model loaded follows the stage's start-up line ("[CPU: 1 PyTorch thread
    # ...]"); the error itself is one line, and the only other thing said.
    lines = [
        line for line in proc.stderr.splitlines() if not (line.startswith("[CPU: ") and line.endswith("]"))
    ]
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    for needle in needles:
        assert needle in proc.stderr, proc.stderr


@pytest.fixture(scope="module")
def unsupported_model(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gpt2")
    (folder / "config.json").write_text(
        json.dumps({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"})
    )
    return folder


@pytest.mark.parametrize("stage", STAGES)
class TestBadInput:
    def test_unknown_model_path(self, stage):
        assert_clean_error(run_stage(stage, "--model", "/no/such/folder", "--prompt", "hi"), "not found")

    def test_hub_id_without_network(self, stage):
        proc = run_stage(stage, "--model", "nobody-here/no-such-model", "--prompt", "hi")
        assert_clean_error(proc, "nobody-here/no-such-model", "hub")

    def test_unsupported_architecture(self, stage, unsupported_model):
        proc = run_stage(stage, "--model", str(unsupported_model), "--prompt", "hi")
        assert_clean_error(proc, "GPT2LMHeadModel", "supported")

    def test_empty_prompt(self, stage, tiny_llama_dir):
        assert_clean_error(run_stage(stage, "--model", str(tiny_llama_dir), "--prompt", ""), "empty")

    def test_prompt_longer_than_context(self, stage, tiny_llama_dir):
        proc = run_stage(stage, "--model", str(tiny_llama_dir), "--prompt", "word " * 400)
        assert_clean_error(proc, "context")

    @pytest.mark.parametrize(
        "flag,value", [("--temperature", "-1"), ("--top-p", "0"), ("--max-tokens", "-1")]
    )
    def test_invalid_sampling_value(self, stage, tiny_llama_dir, flag, value):
        proc = run_stage(stage, "--model", str(tiny_llama_dir), "--prompt", "hi", flag, value)
        assert_clean_error(proc, flag.strip("-").replace("-", "_"))
