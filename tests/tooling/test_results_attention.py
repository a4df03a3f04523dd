"""scripts/results_attention.py: the attention backends' results as one table per GPU, one plot,
and which backend wins each phase against what `--attn auto` picks (the AUTO table)."""

from __future__ import annotations

from pathlib import Path

import pytest

from scripts import render_results as rr
from scripts import results_attention as ra
from scripts.results_model import parse_result
from tests import ROOT
from tests.tooling.test_render import make_repo, result, write

H200 = {"cpu": "Xeon", "gpu": "NVIDIA H200", "compute_capability": "9.0"}
# Made-up speeds: fa prefills fastest, trtllm decodes fastest, fa,trtllm is the best offline pair.
PREFILL = {"fi": (20_000, 60_000, 90_000), "fa": (24_000, 70_000, 100_000)}
DECODE = {"fi": 1.95, "fa": 1.90, "trtllm": 1.70}
OFFLINE = {
    "fi": 19_000,
    "fa": 18_000,
    "fi,fa": 18_500,
    "fa,fi": 19_200,
    "fi,trtllm": 19_100,
    "fa,trtllm": 19_900,
}


def attn_results(prefill=PREFILL, decode=DECODE, offline=OFFLINE, hardware=H200, gpu="h200") -> list[dict]:
    out = []
    for spec, tok_s in offline.items():
        tag, p, d = spec.replace(",", "-"), spec.split(",")[0], spec.split(",")[-1]
        config = {"attn": spec, "page_size": 16, "scale": 1.0, "per_length": 5}
        speeds = dict(zip((512, 2048, 8192), prefill[p], strict=True))
        metrics = {f"prefill_tok_per_s_{n}": v for n, v in speeds.items()} | {
            f"ttft_ms_{n}": 1000 * n / v for n, v in speeds.items()
        }
        for workload, m in (("offline", {"output_tok_per_s": tok_s}), ("latency", {"decode_step_ms": decode[d]}),
                            ("prefill", metrics)):  # fmt: skip
            out.append(result(f"attn_{workload}_{tag}_{gpu}", stage="final", workload=workload, metrics=m,
                              config=config, hardware=hardware))  # fmt: skip
    return out


def parsed(data: list[dict]):
    return [parse_result(d, d["name"]) for d in data]


def test_winners_per_phase():
    (pairs,) = ra.pairs_by_device(parsed(attn_results())).values()
    assert [p.spec for p in pairs] == list(ra.PAIR_ORDER[:6])
    w = ra.winners(pairs)
    assert [b for b, _ in w.prefill] == ["fa", "fi"] and w.lengths == [512, 2048, 8192]
    assert w.prefill[0][1] == pytest.approx((24_000 * 70_000 * 100_000) ** (1 / 3))
    # Decode by step and offline together: fi's pairs (19,100 median) outweigh fa's shorter step.
    assert [b for b, _ in w.decode] == ["trtllm", "fi", "fa"]
    assert w.decode_offline == {"fi": 19_100, "fa": 18_250, "trtllm": 19_500}
    assert w.offline[0] == ("fa,trtllm", 19_900)


def test_decode_weighs_the_batch_1_step_and_the_offline_throughput_equally():
    # The H100's case: fa's step 1% longer, its pairs' offline throughput 3% higher: fa first.
    assert [b for b, _ in ra.decode_ranking({"fi": 1.21, "fa": 1.22}, {"fi": 18_400, "fa": 18_935})] == [
        "fa",
        "fi",
    ]
    # A step 10% longer is not bought back by 3% more throughput.
    assert [b for b, _ in ra.decode_ranking({"fi": 1.21, "fa": 1.34}, {"fi": 18_400, "fa": 18_935})] == [
        "fi",
        "fa",
    ]
    # Without offline runs the step decides.
    assert [b for b, _ in ra.decode_ranking({"fi": 1.21, "fa": 1.22}, {})] == ["fi", "fa"]


def test_the_verdict_sets_the_winners_beside_the_auto_table():
    (pairs,) = ra.pairs_by_device(parsed(attn_results())).values()
    picked = ra.auto_picks(9)
    text = ra.verdict(pairs)
    assert f"picks `{ra._pair(*picked)}`" in text and "compute capability 9.x" in text
    assert ("which agrees" in text) == (picked == ("fa", "trtllm"))
    # Measurements that crown exactly the table's first candidates agree with it.
    prefill = {picked[0]: (30_000, 80_000, 120_000), **{b: (1, 1, 1) for b in ("fi", "fa") if b != picked[0]}}
    decode = {b: (1.0 if b == picked[1] else 3.0) for b in ("fi", "fa", "trtllm")}
    (pairs,) = ra.pairs_by_device(parsed(attn_results(prefill=prefill, decode=decode))).values()
    assert "which agrees" in ra.verdict(pairs)


def test_the_newest_result_of_a_pair_counts_and_other_groups_are_ignored():
    data = attn_results()
    old = result("attn_latency_fi_h200", stage="final", workload="latency", metrics={"decode_step_ms": 0.1},
                 config={"attn": "fi"}, hardware=H200, timestamp="2020-01-01T00:00:00Z")  # fmt: skip
    other = result("final_latency_fi_h200", stage="final", workload="latency", metrics={"decode_step_ms": 0.1},
                   config={"attn": "fi"}, hardware=H200)  # fmt: skip
    (pairs,) = ra.pairs_by_device(parsed([old, other, *data])).values()
    assert next(p for p in pairs if p.spec == "fi").metric("latency", "decode_step_ms") == DECODE["fi"]


def test_one_table_per_gpu_with_the_best_in_bold():
    h100 = {"cpu": "Xeon", "gpu": "NVIDIA H100 80GB HBM3", "compute_capability": "9.0"}
    text = ra.render(parsed(attn_results() + attn_results(hardware=h100, gpu="h100")), "plot.png")
    assert text.index("### H100") < text.index("### H200")
    h200 = text[text.index("### H200") :]
    header = next(line for line in h200.splitlines() if line.startswith("| `--attn`"))
    assert header.split(" | ")[1:4] == ["offline (tok/s)", "batch-1 decode step (ms)", "TTFT 512 (ms)"]
    row = next(line for line in h200.splitlines() if line.startswith("| `fa,trtllm` |"))
    assert "**19,900**" in row and "**1.70**" in row
    assert "**" not in next(line for line in h200.splitlines() if line.startswith("| `fi` |"))
    assert "![The attention backends" in text and "(plot.png)" in text
    assert "Page size 16;" in text and "medians over 5 prompts" in text
    assert "No attention benchmarks yet" in ra.render([], "plot.png")


def test_the_docs_get_the_page_and_the_plot(tmp_path: Path):
    root = make_repo(tmp_path)
    (root / "final").mkdir()
    for data in attn_results():
        write(root, f"h200/{data['name']}.json", data)
    report = rr.write_all(root)
    page = (root / rr.ATTENTION).read_text()
    assert "| `fa,trtllm` |" in page and "../assets/plots/attention_backends.png" in page
    png = (root / rr.ATTENTION_PLOT).read_bytes()
    assert png.startswith(b"\x89PNG") and f"plotted  {rr.ATTENTION_PLOT}" in report
    rr.write_all(root)
    assert (root / rr.ATTENTION_PLOT).read_bytes() == png, "the plot must render the same bytes"
    assert rr.stale_files(root) == []


def test_the_command_prints_the_winners_and_an_auto_entry(tmp_path: Path, capsys):
    for data in attn_results():
        write(tmp_path, f"h200/{data['name']}.json", data)
    assert ra.main([str(tmp_path / "benchmarks/results/h200")]) == 0
    out = capsys.readouterr().out
    assert (
        "auto order from these numbers, compute capability 9: (('fa', 'fi'), ('trtllm', 'fi', 'fa'))" in out
    )
    (tmp_path / "empty").mkdir()
    assert ra.main([str(tmp_path / "empty")]) == 1
    (tmp_path / "empty/attn_broken.json").write_text("{}")
    assert ra.main([str(tmp_path / "empty")]) == 2
    assert "missing key 'name'" in capsys.readouterr().err


def test_auto_cites_the_measured_gpus_and_agrees_with_their_winners():
    """`auto` is chosen by number: the registry's docstring names the result files of every GPU
    measured, and its first candidates are the winners of the GPU measured last for each compute
    capability (vacuous until bench-attn has run)."""
    root = ROOT
    source = (root / "final/attention/registry.py").read_text()
    assert "scripts/results_attention.py" in source
    by_device = ra.pairs_by_device(rr.load_results(root / rr.RESULTS_DIR))
    for device in ra.auto_basis(by_device).values():
        assert f"benchmarks/results/{device.lower()}/attn_" in source, (
            f"AUTO does not cite the {device} results"
        )
        assert "which agrees" in ra.verdict(by_device[device]), f"{device}: {ra.verdict(by_device[device])}"


def test_auto_follows_the_gpu_of_a_capability_measured_last():
    """Two GPUs of one compute capability whose winners differ: the table measured first says that
    `auto` follows the later one instead of asking for new ranks; the later one is judged as usual."""
    h100 = {"cpu": "Xeon", "gpu": "NVIDIA H100 80GB HBM3", "compute_capability": "9.0"}
    swapped = {"fi": PREFILL["fa"], "fa": PREFILL["fi"]}  # fi prefills fastest on the "H100"
    older = attn_results(prefill=swapped, hardware=h100, gpu="h100")
    newer = attn_results()
    for d in newer:
        d["timestamp"] = "2026-02-01T00:00:00Z"
    by_device = ra.pairs_by_device(parsed(older + newer))
    assert ra.auto_basis(by_device) == {9: "H200"}
    text = ra.render(parsed(older + newer), "plot.png")
    h100_part, h200_part = text.split("### H200")
    assert "differs: it follows the H200 table, measured later" in h100_part
    assert "differs" not in h200_part and "follows" not in h200_part
    for d in older:  # measured last, the H100 is the one auto follows
        d["timestamp"] = "2026-03-01T00:00:00Z"
    assert ra.auto_basis(ra.pairs_by_device(parsed(older + newer))) == {9: "H100"}


def test_each_row_names_the_commit_it_measured_and_a_mixed_table_says_so():
    data = attn_results()
    for d in data:
        commit = "bbbbbbb1111" if d["name"].endswith(("fi-fa_h200", "fa-fi_h200")) else "aaaaaaa0000"
        d["versions"] = dict(d["versions"], git_commit=commit)
    text = ra.render(parsed(data), "plot.png")
    row = next(line for line in text.splitlines() if line.startswith("| `fi,fa` |"))
    assert row.endswith("| `bbbbbbb` |")
    assert next(line for line in text.splitlines() if line.startswith("| `fi` |")).endswith("| `aaaaaaa` |")
    assert ra.COMMITS_DIFFER in text
    one = [dict(d, versions=dict(d["versions"], git_commit="aaaaaaa0000")) for d in data]
    assert ra.COMMITS_DIFFER not in ra.render(parsed(one), "plot.png")
