"""scripts/bench_server_online.py against Mini-SGLang's server: the online workload reaches a
`python -m minisgl` server in its wire format (text `prompt` on /v1/chat/completions, one
`delta.content` chunk per token, no usage), readiness is polled, and the server's whole process
group is gone afterwards. The server is a stand-in package named `minisgl` with Mini-SGLang's
flags and stream shape (minisgl/server/args.py and api_server.py); the real one runs on the GPU
host (scripts/gpu_run.sh peers-online)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from scripts import bench_online, bench_server_online, results_versus
from scripts.results_model import Result, parse_result
from stages.common import workloads
from tests.stage_list import ROOT

STAND_IN = r"""
import argparse, json, os, subprocess, sys, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

p = argparse.ArgumentParser()
for flag in ("--model-path", "--dtype", "--attention-backend", "--page-size", "--cuda-graph-max-bs",
             "--max-seq-len-override", "--max-prefill-length", "--host", "--port"):
    p.add_argument(flag, required=True)
args = p.parse_args()
log = os.environ["STAND_IN_LOG"]
# A worker in the server's process group, as Mini-SGLang's scheduler and tokenizer processes are.
worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
with open(log, "w") as f:
    json.dump({"argv": sys.argv[1:], "worker": worker.pid}, f)
time.sleep(float(os.environ.get("STAND_IN_DELAY", "0")))  # loading the model

class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"

    def log_message(self, *a):
        pass

    def do_GET(self):
        if self.path != "/v1/models":
            self.send_error(404)
            return
        body = json.dumps({"object": "list", "data": [{"id": args.model_path, "object": "model"}]})
        self.send_response(200)
        self.end_headers()
        self.wfile.write(body.encode())

    def do_POST(self):
        if self.path != "/v1/chat/completions":  # Mini-SGLang has no /v1/completions
            self.send_error(404)
            return
        req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        assert isinstance(req["prompt"], str), "Mini-SGLang takes text prompts only"
        with open(log + ".prompts", "a") as f:
            f.write(json.dumps(req["prompt"]) + "\n")
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for i in range(req["max_tokens"]):
            delta = {"role": "assistant"} if i == 0 else {}
            delta["content"] = " w"
            chunk = {"id": "cmpl-0", "object": "text_completion.chunk",
                     "choices": [{"delta": delta, "index": 0, "finish_reason": None}]}
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            self.wfile.flush()
        end = {"id": "cmpl-0", "object": "text_completion.chunk",
               "choices": [{"delta": {}, "index": 0, "finish_reason": "stop"}]}
        self.wfile.write(f"data: {json.dumps(end)}\n\ndata: [DONE]\n\n".encode())

ThreadingHTTPServer((args.host, int(args.port)), Handler).serve_forever()
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def stand_in(tmp_path, monkeypatch) -> Path:
    package = tmp_path / "peer" / "minisgl"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "__main__.py").write_text(STAND_IN)
    monkeypatch.setenv("PYTHONPATH", f"{package.parent}{os.pathsep}{ROOT}")
    monkeypatch.setenv("STAND_IN_LOG", str(tmp_path / "stand_in.json"))
    return tmp_path / "stand_in.json"


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (ended, not yet reaped by its parent) counts as gone.
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().split(")")[-1].split()[0] == "Z")


def test_server_commands_carry_the_comparison_settings():
    ours = bench_server_online.server_command("final", Path("ckpt"), 4000, python="py")
    peer = bench_server_online.server_command("mini-sglang", Path("ckpt"), 4000, python="py")
    assert ours[:3] == ["py", "-m", "final"] and peer[:3] == ["py", "-m", "minisgl"]

    def flag(cmd: list[str], name: str) -> str:
        return cmd[cmd.index(name) + 1]

    assert flag(ours, "--attn") == flag(peer, "--attention-backend") == "fi"
    assert flag(ours, "--model") == flag(peer, "--model-path") == "ckpt"
    assert flag(ours, "--port") == flag(peer, "--port") == "4000"
    assert flag(ours, "--host") == flag(peer, "--host") == "127.0.0.1"
    # Page sizes and graph sizes as in bench_peer.py's offline settings for Mini-SGLang.
    assert flag(peer, "--page-size") == "1" and flag(peer, "--cuda-graph-max-bs") == "256"
    assert flag(ours, "--page-size") == "16"
    with pytest.raises(ValueError, match="unknown engine"):
        bench_server_online.server_command("vllm", Path("ckpt"), 4000)


def test_text_prompts_have_the_workloads_token_counts(tiny_tokenizer_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_tokenizer_dir))
    load = workloads.online(8.0, 151_936, seed=0, scale=0.05, num_requests=200)
    texts = bench_online.text_prompts(tokenizer, load.items)
    assert [len(tokenizer.encode(t)) for t in texts] == [len(it.prompt_ids) for it in load.items]
    assert len(set(texts)) == len(texts)  # distinct prompts, as the ids are


def test_a_peer_run_streams_the_workload_and_stops_its_process_group(
    stand_in, tmp_path, tiny_tokenizer_dir, monkeypatch
):
    monkeypatch.setenv("BENCH_RUN_ID", "call-7")
    monkeypatch.setenv("STAND_IN_DELAY", "8")  # not listening for longer than a client starts in
    out = tmp_path / "results"
    argv = ["--engine", "mini-sglang", "--model", str(tiny_tokenizer_dir), "--out-dir", str(out),
            "--name", "peer_minisgl_online_h200", "--rates", "50,inf", "--scale", "0.02",
            "--port", str(free_port()), "--ready-timeout", "120"]  # fmt: skip
    code = subprocess.run([sys.executable, "-m", "scripts.bench_server_online", *argv], cwd=ROOT).returncode
    assert code == 0

    started = json.loads(stand_in.read_text())
    assert started["argv"][started["argv"].index("--attention-backend") + 1] == "fi"
    assert not alive(started["worker"]), "the server's worker outlived the benchmark"

    load = workloads.online(50.0, workloads.MAX_TOKEN_ID + 1, 0, 0.02, num_requests=256)
    wanted = workloads.scaled(256, 0.02)
    for rate in ("50", "inf"):
        result = json.loads((out / f"peer_minisgl_online_h200_rate{rate}.json").read_text())
        assert result["name"] == f"peer_minisgl_online_h200_rate{rate}"
        assert result["stage"] == "mini-sglang" and result["workload"] == "online"
        assert result["run_id"] == "call-7"
        assert result["config"]["rate"] == rate and result["config"]["prompt"] == "text"
        m = result["metrics"]
        assert m["completed"] == wanted and m["failed"] == 0
        # No usage in the stream: the tokens are counted chunk by chunk, exactly the ones asked for.
        assert m["output_tokens"] == sum(it.params.max_tokens for it in load.items[:wanted])
        assert m["ttft_ms_p50"] > 0 and m["itl_ms_p99"] >= m["itl_ms_p50"]


def test_a_server_that_never_answers_is_stopped_after_the_timeout(stand_in, tmp_path, monkeypatch):
    monkeypatch.setenv("STAND_IN_DELAY", "600")
    argv = ["--engine", "mini-sglang", "--model", str(tmp_path), "--out-dir", str(tmp_path / "r"),
            "--name", "x", "--port", str(free_port()), "--ready-timeout", "10"]  # fmt: skip
    run = subprocess.run(
        [sys.executable, "-m", "scripts.bench_server_online", *argv], cwd=ROOT, capture_output=True, text=True
    )
    assert run.returncode == 1
    assert "did not answer" in run.stderr and "/v1/models" in run.stderr
    assert not alive(json.loads(stand_in.read_text())["worker"])
    assert not (tmp_path / "r").exists()  # no benchmark ran


def test_a_server_that_exits_early_is_reported_with_its_log(tmp_path, capsys):
    crash = [sys.executable, "-c", "import sys; print('CUDA error: no device'); sys.exit(3)"]
    argv = ["--engine", "final", "--model", str(tmp_path), "--out-dir", str(tmp_path / "r"), "--name", "x",
            "--port", str(free_port()), "--ready-timeout", "60"]  # fmt: skip
    assert bench_server_online.main(argv, command=crash) == 1
    err = capsys.readouterr().err
    assert "CUDA error: no device" in err and "exited with code 3" in err


def online_result(stage: str, name: str, rate: str, run_id: str, ttft_p50: float, tok_s: float = 1000.0,
                  bursts: float = 0.01, **config: object) -> Result:  # fmt: skip
    metrics = {"ttft_ms_p50": ttft_p50, "ttft_ms_p99": 4 * ttft_p50, "itl_ms_p50": 2.0, "itl_ms_p99": 9.0,
               "output_tok_per_s": tok_s, "burst_share_half_step": bursts}  # fmt: skip
    return parse_result(
        {"name": f"{name}_rate{rate}", "stage": stage, "workload": "online", "metrics": metrics,
         "config": {"rate": rate, "scale": 1.0, "prompt": "text", **config},
         "hardware": {"cpu": "Xeon", "gpu": "NVIDIA H200"}, "versions": {}, "command": "x",
         "timestamp": "2026-11-23T00:00:00Z", "run_id": run_id},
        name,
    )  # fmt: skip


def test_the_performance_page_pairs_online_rows_by_rate_and_call():
    results = [
        online_result("final", "final_online_h200", "8", "c1", 40.0, tok_s=900.0),
        online_result("mini-sglang", "peer_minisgl_online_h200", "8", "c1", 30.0),
        online_result("final", "final_online_h200", "32", "c1", 40.0, bursts=0.2),
        online_result("mini-sglang", "peer_minisgl_online_h200", "32", "c1", 50.0),
        online_result("final", "final_online_h200", "64", "c1", 90.0),
        online_result("mini-sglang", "peer_minisgl_online_h200", "64", "c2", 60.0),  # another call
        online_result("final", "final_online_h200", "inf", "c1", 900.0, scale=0.1),  # not the workload
        online_result("mini-sglang", "peer_minisgl_online_h200", "inf", "c1", 800.0),
    ]
    page = results_versus.render(results)
    h200 = page.split("### H200")[1]
    rows = {row[0]: row[1:] for row in (
        [c.strip() for c in line.strip("|").split("|")] for line in h200.splitlines() if line.startswith("| ")
    )}  # fmt: skip
    # issue 27: throughput at every rate, TTFT from 32 req/s on, bursts below saturation
    assert rows["online 8 req/s, tok/s"][:4] == ["900", "1,000", "0.90×", "≥ 1.00×: not yet"]
    assert rows["online 8 req/s, TTFT p50 (ms)"][:4] == ["40", "30", "0.75×", "—"]
    assert rows["online 32 req/s, TTFT p50 (ms)"][:4] == ["40", "50", "1.25×", "≥ 1.00×: met"]
    assert rows["online 32 req/s, TTFT p99 (ms)"][:4] == ["160", "200", "1.25×", "≥ 1.00×: met"]
    assert rows["online 32 req/s, gaps < ½ step (share)"][3] == "≤ 0.05: not yet"
    assert rows["online 8 req/s, gaps < ½ step (share)"][3] == "≤ 0.05: met"
    assert not any("ITL" in title for title in rows)  # a burst makes ITL p50 small, not good
    assert "`final_online_h200_rate32`, `peer_minisgl_online_h200_rate32`" in h200
    assert not any(title.startswith(("online 64", "online inf")) for title in rows)
    assert "online" not in page.split("### H200")[0]  # the H100 has none


def test_final_args_reach_final_s_server_and_its_results():
    """bench_server_online --final-args: the flags end final/'s command, are recorded in the
    results (--server-args), and final/'s runs ask for its per-token timing (issue 27)."""
    cmd = bench_server_online.server_command("final", Path("ckpt"), 4000, python="py",
                                             final_args="--chunk-policy prefill-first")  # fmt: skip
    assert cmd[-2:] == ["--chunk-policy", "prefill-first"]
    with pytest.raises(ValueError, match="--final-args"):
        bench_server_online.server_command("mini-sglang", Path("ckpt"), 4000, final_args="--x 1")
    argv = ["--engine", "final", "--model", "ckpt", "--out-dir", "r", "--name", "n",
            "--final-args", "--chunk-policy prefill-first", "--num-requests", "64"]  # fmt: skip
    bench = bench_server_online.bench_command(bench_server_online.parse_args(argv), "http://h:1")
    assert "--timing" in bench and bench[bench.index("--server-args") + 1] == "--chunk-policy prefill-first"
    assert bench[bench.index("--num-requests") + 1] == "64"
    peer = bench_server_online.parse_args(
        ["--engine", "mini-sglang", "--model", "m", "--out-dir", "r", "--name", "n"]
    )
    assert "--timing" not in bench_server_online.bench_command(peer, "http://h:1")
    assert peer.rates == "8,32,64,inf"


def test_the_online_section_pairs_a_call_rate_by_rate_with_the_prefill_first_run(tmp_path):
    """results_online (issue 27): the newest call with both servers, a row per rate with final/'s
    and Mini-SGLang's figures and the ratio, final/ prefill-first in the smoothness table; the
    versus table never takes the prefill-first run for final/ as it serves."""
    from scripts import results_online

    late = {"timestamp": "2026-11-24T00:00:00Z"}
    results = [
        online_result("final", "final_online_h200", "8", "old", 10.0),
        online_result("mini-sglang", "peer_minisgl_online_h200", "8", "old", 99.0),
        online_result("final", "final_online_h200", "8", "c1", 40.0),
        online_result("mini-sglang", "peer_minisgl_online_h200", "8", "c1", 50.0),
        online_result("final", "final_online_h200", "inf", "c1", 900.0),
        online_result("mini-sglang", "peer_minisgl_online_h200", "inf", "c1", 600.0),
        online_result("final", "final_online_h200", "inf", "c1", 1.0, scale=0.1),  # not the workload
    ]
    results = [r.__class__(**{**r.__dict__, **(late if r.run_id == "c1" else {})}) for r in results]
    prefill_first = online_result("final", "final_online_prefill_first_h200", "8", "c1", 30.0,
                                  server_args="--chunk-policy prefill-first")  # fmt: skip
    results.append(prefill_first.__class__(**{**prefill_first.__dict__, **late}))
    catch_up = online_result("final", "final_online_catchup_h200", "8", "c1", 20.0,
                             server_args="--attn auto --stream-catch-up-ms 50")  # fmt: skip
    results.append(catch_up.__class__(**{**catch_up.__dict__, **late}))
    page = results_online.render(results, "plot.png")
    h200 = page.split("### H200")[1]
    assert "`c1`" in h200 and "![TTFT p50 and the share of gaps under half a step" in h200
    rows = [line for line in h200.splitlines() if line.startswith("| 8 |") or line.startswith("| inf |")]
    assert "40 · 50 · 1.25×" in rows[0] and "900 · 600 · 0.67×" in rows[1]
    assert any("final/ prefill-first" in line and "| 30 |" in line for line in h200.splitlines())
    assert any("final/ catching up" in line and "| 20 |" in line for line in h200.splitlines())
    assert (
        results_online.plot(results, tmp_path / "online.png") and (tmp_path / "online.png").stat().st_size > 0
    )
    assert (
        not results_online.plot(results[:1], tmp_path / "none.png") and not (tmp_path / "none.png").exists()
    )
    assert "No device call" in results_online.render(results[:1])
    versus = results_versus.render(results).split("### H200")[1]
    assert "online 8 req/s, TTFT p50 (ms) | 40 | 50 |" in versus  # not the prefill-first run's 30 nor 20


def test_the_online_caption_says_how_many_requests_each_call_sent():
    """A long load's call (1,024 requests at 64 req/s) beside the calls of 256: each rate's pair
    names its call and its request count, so a reader does not compare a ramp with a steady load."""
    from scripts import results_online

    late = {"timestamp": "2026-11-29T00:00:00Z"}
    results = [
        online_result("final", "final_online_h200", "8", "c1", 40.0, num_requests=256),
        online_result("mini-sglang", "peer_minisgl_online_h200", "8", "c1", 50.0, num_requests=256),
        online_result("final", "final_online_h200", "64", "c2", 30.0, num_requests=1024),
        online_result("mini-sglang", "peer_minisgl_online_h200", "64", "c2", 60.0, num_requests=1024),
    ]
    results = [r.__class__(**{**r.__dict__, **(late if r.run_id == "c2" else {})}) for r in results]
    h200 = results_online.render(results).split("### H200")[1]
    assert "`c1`: 8 req/s, 256 requests a rate; `c2`: 64 req/s, 1,024 requests a rate" in h200
    one = results_online.render(results[:2]).split("### H200")[1]
    assert "One device call (`c1`, 256 requests a rate)" in one
    # The plot's ticks say it too, for a count that is not the figure's usual one (and only there).
    device = results_online.devices(results)[0]
    call = results_online.newest_call(results, device)
    call["final"]["32"] = call["final"]["8"]  # a second rate of 256: the usual count
    assert results_online.rate_ticks(call, ["8", "32", "64"]) == ["8", "32", "64\n(1,024 requests)"]
    assert results_online.rate_ticks(results_online.newest_call(results[:2], device), ["8"]) == ["8"]


def test_client_processes_share_the_requests_round_robin():
    assert bench_online.shards(7, 3) == [[0, 3, 6], [1, 4], [2, 5]]
    assert bench_online.shards(2, 4) == [[0], [1]]  # no process without a request
    assert 1 <= bench_online.default_client_procs() <= 8


def test_the_online_plot_is_shown_once_for_all_gpus():
    """The figure has a row of panels per GPU, so the page shows it once, after every GPU's tables,
    naming them all (it was shown under each GPU, the same two rows twice)."""
    from scripts import results_online

    results = []
    for gpu, name in (("h200", "NVIDIA H200"), ("h100", "NVIDIA H100 80GB HBM3")):
        for stage, prefix in (("final", "final_online"), ("mini-sglang", "peer_minisgl_online")):
            r = online_result(stage, f"{prefix}_{gpu}", "8", f"call-{gpu}", 40.0)
            results.append(r.__class__(**{**r.__dict__, "hardware": {"cpu": "Xeon", "gpu": name}}))
    page = results_online.render(results, "plot.png")
    assert page.count("](plot.png)") == 1
    assert page.index("](plot.png)") > max(page.index("### H100"), page.index("### H200"))
    assert "against the request rate, H100 and H200" in page


def test_the_local_step_burst_row_is_final_s_own_with_its_goal():
    """`burst_share_local_step` needs the engine's step times, which only final/'s server reports:
    its row shows final/'s share and the goal's verdict, no Mini-SGLang figure and no ratio, and a
    call whose final/ file lacks it shows no such row."""
    ours = online_result("final", "final_online_h200", "32", "c1", 40.0, bursts=0.09)
    theirs = online_result("mini-sglang", "peer_minisgl_online_h200", "32", "c1", 50.0)
    page = results_versus.render([ours, theirs])
    assert "local step" not in page  # this final/ file has no local-step figure
    ours.metrics["burst_share_local_step"] = 0.004
    page = results_versus.render([ours, theirs]).split("### H200")[1]
    rows = {row[0]: row[1:] for row in (
        [c.strip() for c in line.strip("|").split("|")] for line in page.splitlines() if line.startswith("| ")
    )}  # fmt: skip
    assert rows["online 32 req/s, gaps < ½ local step (share)"][:4] == ["0.004", "—", "—", "≤ 0.05: met"]
    assert (
        rows["online 32 req/s, gaps < ½ step (share)"][3] == "≤ 0.05: not yet"
    )  # the stricter line, still shown
    ours.metrics["burst_share_local_step"] = 0.06
    page = results_versus.render([ours, theirs])
    assert "| online 32 req/s, gaps < ½ local step (share) | 0.06 | — | — | ≤ 0.05: not yet |" in page


def test_final_as_served_may_name_attn_auto_and_the_rates_may_come_from_two_calls():
    """gpu_run.sh online-policy starts final/ with `--attn auto` (the server command names fi for
    the comparison): that is final/ as it serves, in both tables; and a session that splits the
    rates over two calls shows every rate, each pair (and prefill-first beside it) from its call."""
    from scripts import results_online
    from scripts.results_model import server_flags

    assert server_flags({"server_args": "--attn auto"}) == [] == server_flags({"server_args": "--attn=auto"})
    assert server_flags({"server_args": "--attn auto --chunk-policy prefill-first"}) == [
        "--chunk-policy",
        "prefill-first",
    ]
    assert server_flags({"server_args": "--attn fi"}) == ["--attn", "fi"]  # not the default: not as served
    served, first = (
        {"server_args": "--attn auto"},
        {"server_args": "--attn auto --chunk-policy prefill-first"},
    )
    results = [
        online_result("final", "final_online_h200", "8", "c6", 13.0, **served),
        online_result("final", "final_online_prefill_first_h200", "8", "c6", 12.0, **first),
        online_result("mini-sglang", "peer_minisgl_online_h200", "8", "c6", 22.0),
        online_result("final", "final_online_h200", "64", "c5", 30.0, **served),
        online_result("final", "final_online_prefill_first_h200", "64", "c5", 22.0, **first),
        online_result("mini-sglang", "peer_minisgl_online_h200", "64", "c5", 58.0),
        online_result("final", "final_online_h200", "64", "c0", 99.0, **{"server_args": "--attn fi"}),
    ]
    h200 = results_online.render(results).split("### H200")[1]
    assert "(`c6`: 8 req/s; `c5`: 64 req/s)" in h200
    assert "13 · 22 · 1.69×" in h200 and "30 · 58 · 1.93×" in h200
    assert any("final/ prefill-first" in line and "| 22 |" in line for line in h200.splitlines())
    versus = results_versus.render(results).split("### H200")[1]
    assert "online 64 req/s, TTFT p50 (ms) | 30 | 58 |" in versus
