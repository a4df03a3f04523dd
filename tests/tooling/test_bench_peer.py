"""scripts/bench_peer.py: a peer engine serves exactly our offline workload (Nano-vLLM's draw), and
its result lands in our schema, beside ours on the results page. The peer is a stand-in package
with Mini-SGLang's offline API: the real one runs on the GPU host (scripts/gpu_run.sh ladder)."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

from scripts import bench_peer
from scripts.render_results import parse_result
from tests.stage_list import ROOT

STAND_IN = """
import json, os, time
from dataclasses import dataclass

@dataclass
class SamplingParams:
    temperature: float = 0.0
    top_k: int = -1
    top_p: float = 1.0
    ignore_eos: bool = False
    max_tokens: int = 1024

class LLM:
    def __init__(self, model_path, dtype=None, **kwargs):
        self.kwargs = kwargs

    def generate(self, prompts, sampling_params):
        if isinstance(sampling_params, SamplingParams):
            sampling_params = [sampling_params] * len(prompts)
        if len(prompts) > 1:  # the measured call, not the warm-up
            with open(os.environ["STAND_IN_LOG"], "w") as f:
                json.dump({"prompts": prompts, "outs": [p.max_tokens for p in sampling_params],
                           "temperature": sampling_params[0].temperature,
                           "ignore_eos": all(p.ignore_eos for p in sampling_params),
                           "backend": self.kwargs["attention_backend"]}, f)
            time.sleep(0.05)
        else:  # batch 1 (the latency workload): 500 ms, plus 4 ms per token
            with open(os.environ["STAND_IN_LOG"], "a") as f:
                f.write(json.dumps({"prompt": prompts[0], "out": sampling_params[0].max_tokens,
                                    "temperature": sampling_params[0].temperature}) + "\\n")
            time.sleep(0.5 + 0.004 * sampling_params[0].max_tokens)
        return [{"text": "", "token_ids": [0] * p.max_tokens} for p in sampling_params]
"""


def nano_vllm_draw(num_seqs: int = 256) -> tuple[list[list[int]], list[int]]:
    """Nano-vLLM's bench.py, draw for draw: the prompts first, then the output lengths."""
    random.seed(0)
    prompts = [[random.randint(0, 10000) for _ in range(random.randint(100, 1024))] for _ in range(num_seqs)]
    return prompts, [random.randint(100, 1024) for _ in range(num_seqs)]


def test_peer_requests_are_nano_vllms(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 151936}))  # Qwen3's
    prompts, outs, temperature = bench_peer.peer_requests(tmp_path, seed=0, scale=1.0)
    assert (prompts, outs) == nano_vllm_draw() and temperature == 0.6


def stand_in_peer(tmp_path: Path) -> tuple[Path, Path]:
    """A Mini-SGLang stand-in package and a checkpoint folder with Qwen3's vocabulary."""
    package = tmp_path / "peer" / "minisgl"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "core.py").write_text(STAND_IN)
    (package / "llm.py").write_text("from minisgl.core import LLM\n")
    model = tmp_path / "ckpt"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"vocab_size": 151936}))
    return tmp_path / "peer", model


def test_a_stand_in_mini_sglang_run_gives_a_result_in_our_schema(tmp_path: Path) -> None:
    peer, model = stand_in_peer(tmp_path)
    log, out = tmp_path / "seen.json", tmp_path / "out"
    env = {"PYTHONPATH": f"{peer}:{ROOT}", "STAND_IN_LOG": str(log), "BENCH_RUN_ID": "call-7",
           "PATH": "/usr/bin:/bin"}  # fmt: skip
    cmd = [sys.executable, "-m", "scripts.bench_peer", "--engine", "mini-sglang", "--model", str(model),
           "--out", str(out), "--name", "ladder_minisgl_test", "--repeats", "2"]  # fmt: skip
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    seen = json.loads(log.read_text())
    prompts, outs = nano_vllm_draw()
    assert seen["prompts"] == prompts and seen["outs"] == outs
    assert seen["temperature"] == 0.6 and seen["ignore_eos"] and seen["backend"] == "fi"
    data = json.loads((out / "ladder_minisgl_test.json").read_text())
    result = parse_result(data, "ladder_minisgl_test.json")
    assert result.stage == "mini-sglang" and result.workload == "offline" and result.group == "ladder"
    assert data["run_id"] == "call-7" and len(data["runs"]) == 2
    assert data["metrics"]["output_tokens"] == sum(outs) == 133_966
    assert 0 < data["metrics"]["output_tok_per_s"] < sum(outs) / 0.05  # the stand-in sleeps 50 ms


def test_the_peers_batch1_decode_step_is_the_difference_of_two_calls(tmp_path: Path) -> None:
    """Our latency workload's prompt, greedy; a warm-up, a 1-token call and a 128-token call; the
    step is (t_128 - t_1) / 127, which cancels the prefill (the stand-in: 4 ms per token)."""
    from stages.common.workloads import latency

    peer, model = stand_in_peer(tmp_path)
    log, out = tmp_path / "seen.jsonl", tmp_path / "out"
    env = {"PYTHONPATH": f"{peer}:{ROOT}", "STAND_IN_LOG": str(log), "PATH": "/usr/bin:/bin"}
    cmd = [sys.executable, "-m", "scripts.bench_peer", "--engine", "mini-sglang", "--workload", "latency",
           "--model", str(model), "--out", str(out), "--name", "peer_minisgl_latency_test"]  # fmt: skip
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    ours = latency(151936).items[0]
    assert [c["out"] for c in calls] == [16, 1, ours.params.max_tokens] == [16, 1, 128]
    assert all(c["prompt"] == ours.prompt_ids and c["temperature"] == 0.0 for c in calls)
    data = json.loads((out / "peer_minisgl_latency_test.json").read_text())
    result = parse_result(data, "peer_minisgl_latency_test.json")
    assert result.stage == "mini-sglang" and result.workload == "latency"
    assert 3.9 <= data["metrics"]["decode_step_ms"] < 6  # 4 ms, plus what a loaded machine adds
    assert data["metrics"]["one_token_ms"] >= 504
