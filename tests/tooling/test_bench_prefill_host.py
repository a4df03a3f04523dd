"""scripts/bench_prefill_host.py on the CPU: per backend and prompt length, the host's launch time
of a batch-1 prefill and the whole prefill, the launch inside it."""

from __future__ import annotations

import json
import os

import final
from final.attention import fa4_replay
from final.engine import prefill_graph
from scripts.bench_prefill_host import main, spec_and_switches
from scripts.results_model import parse_result


def test_each_length_has_its_launch_inside_its_prefill(tiny_qwen3_dir, tmp_path):
    assert main(["--model", str(tiny_qwen3_dir), "--attn", "torch", "--device", "cpu", "--tokens", "8", "40",
                 "--repeats", "2", "--out-dir", str(tmp_path), "--profile"]) == 0  # fmt: skip
    data = json.loads((tmp_path / "prefill_host.json").read_text())
    assert data["tokens"] == [8, 40] and set(data["by_attn"]) == {"torch"}
    for n in ("8", "40"):
        row = data["by_attn"]["torch"][n]
        assert 0 < row["launch_ms"] <= row["step_ms"]
        calls = row["profile"]
        assert 0 < len(calls) <= 30 and calls == sorted(calls, key=lambda c: -c["own_ms"])
        assert any("forward" in c["call"] for c in calls)  # the model's layers are among them


def test_a_batch_of_prompts_is_one_prefill_step(tiny_qwen3_dir, tmp_path):
    assert main(["--model", str(tiny_qwen3_dir), "--attn", "torch", "--device", "cpu", "--tokens", "24",
                 "--repeats", "1", "--batch", "3", "--out-dir", str(tmp_path), "--name", "b3"]) == 0  # fmt: skip
    data = json.loads((tmp_path / "b3.json").read_text())
    row = data["by_attn"]["torch"]["24"]
    assert data["batch"] == 3 and row["prompt_tokens"] == 3 * 24 and 0 < row["launch_ms"]


def switches_at_build(model, out, monkeypatch, env: str, specs: list[str]) -> list[tuple[str, str | None]]:
    """Run the script on the CPU for `specs`: (each engine's --attn, `env` as its build saw it)."""
    built, real = [], final.LLM

    def llm(*args, **kwargs):
        built.append((kwargs["attn"], os.environ.get(env)))
        return real(*args, **kwargs)

    monkeypatch.setattr(final, "LLM", llm)
    monkeypatch.delenv(env, raising=False)
    assert main(["--model", str(model), "--attn", *specs, "--device", "cpu",
                 "--tokens", "8", "--repeats", "1", "--out-dir", str(out)]) == 0  # fmt: skip
    assert env not in os.environ  # set around the build alone
    return built


def test_a_no_replay_spec_builds_its_engine_with_fa4_replay_off(tiny_qwen3_dir, tmp_path, monkeypatch):
    built = switches_at_build(
        tiny_qwen3_dir, tmp_path, monkeypatch, fa4_replay.ENV, ["torch", "torch:no-replay"]
    )
    assert built == [("torch", None), ("torch", "0")]
    data = json.loads((tmp_path / "prefill_host.json").read_text())
    assert set(data["by_attn"]) == {"torch", "torch:no-replay"}


def test_suffixes_set_their_switches_in_either_order():
    eager = {prefill_graph.ENV: "0"}
    assert spec_and_switches("fa,fi") == ("fa,fi", {})
    assert spec_and_switches("fa,fi:eager") == ("fa,fi", eager)
    both = {fa4_replay.ENV: "0", **eager}
    assert spec_and_switches("fa:eager:no-replay") == spec_and_switches("fa:no-replay:eager") == ("fa", both)


def test_an_eager_spec_builds_its_engine_without_prefill_graphs(tiny_qwen3_dir, tmp_path, monkeypatch):
    built = switches_at_build(
        tiny_qwen3_dir, tmp_path, monkeypatch, prefill_graph.ENV, ["torch", "torch:eager"]
    )
    assert built == [("torch", None), ("torch", "0")]


def test_each_spec_becomes_a_result_the_results_page_reads(tiny_qwen3_dir, tmp_path):
    assert main(["--model", str(tiny_qwen3_dir), "--attn", "torch", "torch:eager", "--device", "cpu",
                 "--tokens", "8", "24", "--repeats", "1", "--results-dir", str(tmp_path)]) == 0  # fmt: skip
    found = {}
    for path in sorted(tmp_path.glob("*.json")):
        result = parse_result(json.loads(path.read_text()), str(path))
        found[result.name] = result
    assert set(found) == {"final_prefill_host_torch_cpu", "final_prefill_host_torch-eager_cpu"}
    for result in found.values():
        assert result.workload == "prefill-host" and result.group == "final"
        assert set(result.metrics) == {"step_ms_8", "step_ms_24", "launch_ms_8", "launch_ms_24"}
        assert 0 < result.metrics["launch_ms_24"] <= result.metrics["step_ms_24"]
    assert found["final_prefill_host_torch-eager_cpu"].config["attn"] == "torch:eager"


def test_the_breakdown_splits_each_launch_into_disjoint_parts(tiny_qwen3_dir, tmp_path):
    """--breakdown: per length, the runner's and the backend's prepare once a prefill, attention
    once a layer, and what is left of the launch; the parts add up to the launch."""
    assert main(["--model", str(tiny_qwen3_dir), "--attn", "torch", "--device", "cpu", "--tokens", "8", "40",
                 "--repeats", "2", "--out-dir", str(tmp_path), "--breakdown"]) == 0  # fmt: skip
    data = json.loads((tmp_path / "prefill_host.json").read_text())
    layers = json.loads((tiny_qwen3_dir / "config.json").read_text())["num_hidden_layers"]
    for n in ("8", "40"):
        split = data["by_attn"]["torch"][n]["breakdown"]
        assert split["calls"] == {
            "runner_prepare": 1,
            "backend_prepare": 1,
            "graph_pieces": 0,
            "attention": layers,
        }
        parts = ("runner_prepare_ms", "backend_prepare_ms", "graph_pieces_ms", "attention_ms", "rest_ms")
        assert all(split[p] >= 0 for p in parts) and split["attention_ms"] > 0
        assert split["launch_ms"] > 0
        # medians of each part need not add up exactly; each repeat's parts do (rest is the remainder)
        assert split["rest_ms"] < split["launch_ms"]
