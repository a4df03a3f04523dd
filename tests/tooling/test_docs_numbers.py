"""Measured numbers in the book come from the result files, never from a hand (scripts/docs_numbers.py).

- every `{{ ... }}` macro of every page evaluates against the committed results and profiles, and
  a macro naming a missing result, metric or profile fails with the page, the line and what exists
  (the mkdocs hook turns that into a failed build);
- no page types a number that looks measured (a time, a throughput, a ratio, a size, a share, a
  count of kernels) outside a macro, except the entries of `ALLOWED`: numbers that are not
  measurements (model shapes and the arithmetic on them, a datasheet figure with its source
  linked, a goal, a setting), each with the reason it may stand. The scan reads the book's pages,
  the notebooks' markdown cells, README.md and benchmarks/README.md;
- README.md, which mkdocs does not build, quotes its figures from numbers blocks, and its text is
  what their templates give against the committed results (`make docs-gen` writes it).
"""

from __future__ import annotations

import fnmatch
import re
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from scripts import docs_numbers, mkdocs_hooks
from tests import ROOT

PAGES = sorted(p for p in (ROOT / "docs").rglob("*.md") if "generated" not in p.parts)
# Read by people but not built by mkdocs: their figures come from numbers blocks (README.md) or
# are not measurements at all (benchmarks/README.md's schema example is code).
READMES = [ROOT / "README.md", ROOT / "benchmarks" / "README.md"]
NOTEBOOKS = sorted((ROOT / "docs" / "notebooks").glob("[0-9][0-9]_*.py"))


def prose_source(path: Path) -> str:
    """What a reader reads of a file, as Markdown, lines kept: a notebook's markdown cells (its code
    computes what it prints), a README's text with each numbers block's template in place of the
    text written from it."""
    text = path.read_text("utf-8")
    if path.suffix == ".py":
        lines, markdown = [], False
        for line in text.splitlines():
            if line.startswith("# %%"):
                markdown = "[markdown]" in line
                lines.append("")
            else:
                lines.append(line.removeprefix("# ").removeprefix("#") if markdown else "")
        return "\n".join(lines)
    return docs_numbers.block_templates(text)


SCANNED = PAGES + READMES + NOTEBOOKS

# What a measured number looks like: a number with a unit of time, throughput, size or share, a
# ratio (`1.28×`, `8.6x`), `18.9k`, "4.5 times", a count of kernels, launches or operators, or
# seconds with decimals (`5.9 s`; whole seconds are timeouts and settings).
# (A comma groups thousands only: "step N+1, launches it" holds no count of launches.)
NUMBER = r"(?<![\w.\-/])(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?"
MEASURED = re.compile(
    NUMBER
    + r"(?:\s?(?:ms|µs|us|tok/s|tokens/s|(?:output )?tokens (?:per|a) second|GB|GiB|MB|MiB|KB|TB/s|GB/s|%)(?![\w/])"
    + r"|[×x](?![\w])|k(?![\w])|\s(?:times|kernels|launches|operators)\b)"
    + r"|(?<![\w.])\d+\.\d+\s?s\b"
)


# (page glob, phrase around the number, why it is not a measurement). The phrase must appear
# within the finding's context on the page.
SHAPE = "arithmetic on a model's shape (layers, heads, sizes), worked out in the text"
SHEET = "a datasheet figure, its source linked beside it"
ASSUMED = "a round figure the text assumes for its arithmetic, and says so"
GOAL = "a target an issue set, not a result"
SETTING = "a setting or a constant of the code, not a measurement"
WORKLOAD = "arithmetic on the workload's counts, not a measurement"
QUOTED = "quoted from the project's design notes in the box that says so (no result file holds it)"
ALLOWED: list[tuple[str, str, str]] = [
    ("docs/notebooks/01_naive_generate.py", "so the KV cache is 3x smaller", SHAPE),
    ("docs/notebooks/04_chunked_prefill.py", "one long gap among hundreds is under 1 %", WORKLOAD),
    ("docs/serving/kv_fp8.md", "(at -4.65, 3.7% of it)",
     "a GPU test's failure message (benchmarks/logs/h100-2026-11-25/test-kv-fp8.log), not a benchmark"),
    ("docs/serving/kv_fp8.md", "0.1 plus 5% of the logprob", "the test's bound, XQA_FP8_RTOL in tests/final/kvcache/test_final_gpu_kv_fp8.py"),
    ("docs/serving/kv_fp8.md", "(64 prompts of 4k to 16k tokens, 128 greedy", WORKLOAD),
    ("docs/serving/kv_fp8.md", "the capacity table: at 8k", WORKLOAD),
    ("docs/serving/performance.md", "short of the 1.05× asked", GOAL),
    ("docs/serving/performance.md", "under the 5% asked", GOAL + " (issue 31)"),
    ("docs/serving/performance.md", "under the 1.05× asked", GOAL),
    ("docs/serving/performance.md", "over the 5% line at 32", GOAL + " (issue 27)"),
    ("docs/serving/kv_fp8.md", "2^-8 (0.4%) | 2^-4 (6.25%)", "the formats' rounding, arithmetic on their bit counts"),
    ("docs/serving/kv_fp8.md", "at most half a step: 6.25% of its size", "E4M3's rounding, from its 3 mantissa bits"),
    ("docs/serving/kv_fp8.md", "far below 6.25% of its size", "E4M3's rounding, from its 3 mantissa bits"),
    ("docs/serving/kv_fp8.md", "loses more than 6.25%", "E4M3's rounding, from its 3 mantissa bits"),
    ("docs/serving/kv_fp8.md", "a rounding 16 times finer than FP8's", "bf16's 7 mantissa bits against E4M3's 3"),
    ("docs/serving/kv_fp8.md", "one 8k-token request of Qwen3-0.6B holds 896 MiB of bf16 cache, 448 MiB", SHAPE),
    ("docs/chapters/01_naive_generate.md", "context takes 360 MiB", SHAPE),
    ("docs/chapters/01_naive_generate.md", "weights take about 540 MB", SHAPE),
    ("docs/chapters/01_naive_generate.md", "weights are about 1.2 GB", SHAPE),
    ("docs/chapters/01_naive_generate.md", "H200 (4.8 TB/s, [NVIDIA's specification", SHEET),
    ("docs/chapters/01_naive_generate.md", "on an 80 GB GPU with 16 GB of weights", SHAPE),
    ("docs/chapters/02_paged_kv.md", "reads about 0.11 GB of KV", SHAPE),
    ("docs/chapters/02_paged_kv.md", "64 of them read about 7 GB", SHAPE),
    ("docs/chapters/02_paged_kv.md", "the table 16 times smaller", SHAPE),
    ("docs/chapters/02_paged_kv.md", "PCIe 5 at about 50 GB/s each way", ASSUMED),
    ("docs/chapters/02_paged_kv.md", "FLOPs, 2-3 µs, and swapping its 112 KiB of KV about 2 µs", ASSUMED),
    ("docs/chapters/02_paged_kv.md", "around 280 µs, while swapping is about 7 µs", ASSUMED),
    ("docs/chapters/03_radix_cache.md", "a 100% prefix hit", "a case (a whole prompt cached), not a measurement"),
    ("docs/chapters/03_radix_cache.md", "among the run's 736 are more than 1 %", WORKLOAD),
    ("docs/chapters/04_chunked_prefill.md", "bytes = 192 MiB each", SHAPE),
    ("docs/chapters/04_chunked_prefill.md", "a 4x longer prompt (8,192 to 32,768 tokens)", WORKLOAD),
    ("docs/chapters/04_chunked_prefill.md", "costs about the same; a 4x larger budget", WORKLOAD),
    ("docs/chapters/04_chunked_prefill.md", "arrive 0.1 s apart", SETTING),
    ("docs/chapters/04_chunked_prefill.md", "prefilled in one step, fewer still, under 1 %", WORKLOAD),
    ("docs/chapters/04_chunked_prefill.md", "a target ITL (say 30 ms)", "an example target the reader picks"),
    ("docs/chapters/04_chunked_prefill.md", "about 3.8 GB per prompt: some 75 ms over PCIe 5", ASSUMED),
    ("docs/chapters/04_chunked_prefill.md", "At about 50 GB/s (PCIe 5 x16) that is about 75 ms", ASSUMED),
    ("docs/chapters/04_chunked_prefill.md", "at about 900 GB/s (NVLink on Hopper", SHEET),
    ("docs/chapters/04_chunked_prefill.md", "specification ) about 4 ms", ASSUMED),
    ("docs/chapters/05_cuda_graph.md", "(about 1.2 GB in bfloat16), which at the 4.8 TB/s", SHEET),
    ("docs/chapters/05_cuda_graph.md", "about 150 MiB", SHAPE),
    ("docs/chapters/05_cuda_graph.md", "would pass 1 GiB per layer", SETTING),
    ("docs/chapters/05_cuda_graph.md", "longer than 20 µs", SETTING + " (render_profile.LONG_GAP_US)"),
    ("docs/chapters/05_cuda_graph.md", "its own 8 MiB integer workspace", SETTING),
    ("docs/chapters/05_cuda_graph.md", "a pinned 8 MiB buffer", SETTING),
    ("docs/chapters/05_cuda_graph.md", "about 34 × 8 MiB (some 270 MiB)", SHAPE),
    ("docs/chapters/06_overlap.md", "at least 25% more offline output tokens", GOAL),
    ("docs/chapters/06_overlap.md", "against the target of 1.25×", GOAL),
    ("docs/chapters/06_overlap.md", "longer than 20 µs", SETTING + " (render_profile.LONG_GAP_US)"),
    ("docs/chapters/07_tensor_parallel.md", "matrices), 16.4 GB in bfloat16. At the 4.8 TB/s of an [H200", SHEET),
    ("docs/chapters/07_tensor_parallel.md", "takes at least 3.4 ms, whatever the software does", SHAPE),
    ("docs/chapters/07_tensor_parallel.md", "each reads 8.2 GB per step, in parallel with the other: 1.7 ms", SHAPE),
    ("docs/chapters/07_tensor_parallel.md", "73 all-reduces of 8 KB each", SHAPE),
    ("docs/chapters/07_tensor_parallel.md", "at most 0.6 times its TP=1 step", GOAL),
    ("docs/serving/attention.md", "its first 8 MiB for them", SETTING),
    ("docs/serving/cli.md", "4194304 (4 MiB)", SETTING),
    ("docs/serving/safety.md", "request body | 4 MiB", SETTING),
    ("docs/serving/performance.md", "at least **1.05×** Mini-SGLang's", GOAL + " (issue 31)"),
    ("docs/serving/performance.md", "aiming at **1.15×**", GOAL + " (issue 31)"),
    ("docs/serving/performance.md", "at most **1.5 ms** on an H200", GOAL),
    ("docs/serving/performance.md", "Mini-SGLang's (within 3%)", GOAL + " (issue 31)"),
    ("docs/serving/performance.md", "GPU idle under 5%", GOAL + " (issue 31)"),
    ("docs/serving/performance.md", "past the 1.05× the goal requires and past the 1.15× it aims at", GOAL),
    ("docs/serving/performance.md", "around the 1.05× line", GOAL),
    ("docs/serving/attention.md", "It ships at 25%", SETTING + " (TENSOR_CORE_MIN_SPREAD)"),
    ("docs/serving/index.md", "50 is what was", SETTING + " (--stream-catch-up-ms, the value measured)"),
    ("docs/serving/index.md", "catching up at 50 ms", SETTING + " (--stream-catch-up-ms, the value measured)"),
    ("docs/serving/index.md", "with it at 50 ms", SETTING + " (--stream-catch-up-ms, the value measured)"),
    ("docs/serving/performance.md", "under the 1.5 ms goal", GOAL),
    ("docs/serving/performance.md", "where the goal asks for under 5%", GOAL),
    ("docs/serving/performance.md", "Mini-SGLang 21-22k output tok/s (16.1k with its overlap", QUOTED),
    ("docs/serving/performance.md", "Nano-vLLM about 16.5k", QUOTED),
    ("docs/serving/performance.md", "ceiling for this workload about 36k on an H200 and 25.7k on an H100", QUOTED),
    ("docs/serving/performance.md", "Mini-SGLang 1.7-1.8 ms with CUDA graphs and 5.93 ms without", QUOTED),
    ("docs/serving/performance.md", "HF transformers' 47 ms", QUOTED),
    ("docs/serving/performance.md", "about 1.2 GB at the H200's 4.8 TB/s", SHEET),
    ("docs/serving/performance.md", "which the notes round to 0.3 ms", QUOTED),
    ("docs/serving/performance.md", "4.8k tok/s offline and a 23.5 ms batch-1 step", QUOTED),
    ("docs/serving/performance.md", "about 28 ms of host time against 3.3 ms of kernels", QUOTED),
    ("docs/serving/performance.md", "longer than 20 µs", SETTING + " (render_profile.LONG_GAP_US)"),
    ("docs/serving/performance.md", "throughput at least **1.0×** Mini-SGLang's", GOAL + " (issue 27)"),
    ("docs/serving/performance.md", "at least **95%** of a stream's gaps", GOAL + " (issue 27)"),
    ("docs/serving/performance.md", "ITL p50 within **20%** of the step", GOAL + " (issue 27)"),
    ("docs/serving/index.md", "a token every 10 ms, and no more than 5% of the gaps", SETTING + " (the streaming test's)"),
    ("docs/serving/index.md", "a client reads may be under 2 ms", SETTING + " (the streaming test's)"),
    ("docs/serving/metrics.md", "with at most 5% of their gaps", SETTING + " (stream_metrics.SMOOTH_MAX_BURSTS)"),
    ("docs/serving/performance.md", "lists the 25 kernels that take the most", SETTING + " (kernel_breakdown's top 25)"),
]  # fmt: skip


def masked(text: str) -> str:
    """The page as prose: code (fenced and inline), math, link targets, HTML comments, snippet
    lines and macros blanked out, so their numbers are not read as typed measurements."""
    patterns = [
        r"^([ \t]*)(```|~~~)[^\n]*\n.*?^\1\2[ \t]*$",  # fenced blocks (any indent)
        r"<!--.*?-->",
        r"\$\$.*?\$\$",
        r"(?<!\\)\$[^$\n]+\$",
        r"`[^`\n]+`",
        r"\]\([^)\s]+\)",
        r"https?://\S+",
        r"^[ \t]*--8<--[^\n]*$",
        docs_numbers.MACRO.pattern,
    ]
    for pattern in patterns:
        text = re.sub(pattern, lambda m: re.sub(r"[^\n]", " ", m.group(0)), text, flags=re.S | re.M)
    return text


def macro_texts(text: str) -> str:
    """The page with each macro replaced by the text of its string constants (the prose of a
    `when(...)`): a number typed there is typed by hand too. Names and keys hold no units."""
    import ast

    def strings(match: re.Match[str]) -> str:
        try:
            tree = ast.parse(match.group(1), mode="eval")
        except SyntaxError:
            return match.group(0)
        found = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)]
        return " ".join(found).replace("\n", " ") + "\n" * match.group(0).count("\n")  # lines stay

    return docs_numbers.MACRO.sub(strings, text)


def findings(page: str, text: str) -> list[str]:
    """Each number that looks measured and is not allowed: `page:line: context`."""
    prose = masked(macro_texts(text))
    out = []
    for match in MEASURED.finditer(prose):
        context = " ".join(prose[max(0, match.start() - 80) : match.end() + 80].split())
        if any(fnmatch.fnmatch(page, glob) and phrase in context for glob, phrase, _ in ALLOWED):
            continue
        line = prose.count("\n", 0, match.start()) + 1
        out.append(f"{page}:{line}: {match.group(0)!r} in ...{context}...")
    return out


def test_no_page_types_a_measured_number_by_hand() -> None:
    found = [f for page in SCANNED for f in findings(page.relative_to(ROOT).as_posix(), prose_source(page))]
    assert not found, (
        "numbers that look measured, typed by hand (use a {{ result(...) }} macro, see "
        "scripts/docs_numbers.py, or add a reasoned entry to ALLOWED):\n" + "\n".join(found)
    )


def test_the_scanner_sees_typed_numbers_and_not_macros_code_or_links() -> None:
    typed = "The step takes 4.89 ms, 4.5 times shorter, 1.28× the serial one, 18.9k tok/s, 9%, 1,768 kernels, 5.9 s."
    assert [f.split("'")[1] for f in findings("x.md", typed)] == [
        "4.89 ms", "4.5 times", "1.28×", "18.9k", "9%", "1,768 kernels", "5.9 s",
    ]  # fmt: skip
    hidden = '{{ when("a", "b", "then it took 4.89 ms", "") }}'
    assert [f.split("'")[1] for f in findings("x.md", hidden)] == ["4.89 ms"]
    quiet = (
        'It takes {{ result("a", "decode_step_ms") }} ms. `4.89 ms` in code, [a link](x.md#4-ms),\n'
        "```text\n4.89 ms\n```\n$$ 2 \\times 16 = 32 \\text{ ms} $$ and a 30 s timeout, torch 2.11, page 16."
    )
    assert findings("x.md", quiet) == []


def test_an_allowed_phrase_lets_its_number_stand_on_its_page_only(monkeypatch) -> None:
    monkeypatch.setattr(sys.modules[__name__], "ALLOWED", [("docs/a.md", "4.8 TB/s of", "datasheet")])
    text = "at the 4.8 TB/s of an H200"
    assert findings("docs/a.md", text) == []
    assert len(findings("docs/b.md", text)) == 1


def test_every_allowed_phrase_is_still_on_its_pages() -> None:
    """An entry whose phrase no page has any more is dead weight that could hide a new number."""
    texts = {
        p.relative_to(ROOT).as_posix(): " ".join(masked(macro_texts(prose_source(p))).split())
        for p in SCANNED
    }
    dead = [(glob, phrase) for glob, phrase, _ in ALLOWED
            if not any(fnmatch.fnmatch(page, glob) and phrase in text for page, text in texts.items())]  # fmt: skip
    assert not dead, dead


# ---------------------------------------------------------------------------------------------
# The macros


@pytest.fixture(scope="module")
def numbers() -> docs_numbers.Numbers:
    return docs_numbers.Numbers.load(ROOT)


def test_every_macro_of_every_page_reads_its_result(numbers) -> None:
    problems, count = [], 0
    for page in PAGES:
        text = page.read_text("utf-8")
        count += len(docs_numbers.macros(text))
        try:
            expanded = docs_numbers.expand(text, numbers, page.relative_to(ROOT).as_posix())
        except docs_numbers.NumbersError as exc:
            problems.append(str(exc))
            continue
        assert "{{" not in masked(expanded), f"{page.name}: a {{{{ ... }}}} that is not a macro of ours"
    assert not problems, "\n".join(problems)
    assert count > 50, "the pages should quote their measurements through macros"


def test_a_macro_reads_formats_and_computes(numbers) -> None:
    name = "stage05_decode_b1_graphs_h200"
    step = numbers.results[name].metrics["decode_step_ms"]
    text = (
        f'{{{{ result("{name}", "decode_step_ms") }}}} | {{{{ result("{name}", "decode_step_ms", digits=3) }}}} | '
        f'{{{{ ratio(value("{name}", "decode_step_ms") * 2, value("{name}", "decode_step_ms")) }}}} | '
        f'{{{{ pct(1, 8) }}}} | {{{{ fmt(1234567) }}}} | {{{{ date("{name}") }}}}'
    )
    out = docs_numbers.expand(text, numbers, "x.md").split(" | ")
    assert out[0] == f"{step:.2f}" and out[1] == f"{step:.3f}"
    assert out[2:5] == ["2.00×", "12%", "1,234,567"]
    assert out[5] == numbers.results[name].timestamp[:10]


def test_measured_on_says_where_when_with_what_and_how_often(numbers) -> None:
    cpu = "stage04_long_prompt_mixed_64_cpu"  # three repeats
    gpu = ["stage05_decode_b1_graphs_h200", "stage05_decode_b1_eager_h200"]  # one run each
    torch = numbers.results[gpu[0]].versions["torch"].split("+")[0]
    assert numbers.measured_on(*gpu).startswith(
        f"one H200, {numbers.date(gpu[0])}, torch {torch}, FlashInfer "
    )
    assert numbers.measured_on(*gpu).endswith("one run each")
    tp = "stage07_tp2_latency_qwen38b_h200"  # on a host of four: not "one H200"
    assert numbers.results[tp].hardware["gpu_count"] == 4
    assert numbers.measured_on(tp).startswith(f"a host of four H200s, {numbers.date(tp)}, torch ")
    torch = numbers.results[cpu].versions["torch"].split("+")[0]
    cores, model = (numbers.results[cpu].hardware[k] for k in ("cpu_cores", "cpu"))
    assert (
        numbers.measured_on(cpu)
        == f"a {cores}-core {model}, {numbers.date(cpu)}, torch {torch}, the median of three runs"
    )


@pytest.mark.parametrize(
    "macro, message",
    [
        ('{{ result("stage05_nope_h200", "decode_step_ms") }}', "no result named 'stage05_nope_h200'"),
        (
            '{{ result("stage05_decode_b1_graphs_h200", "nope_ms") }}',
            "has no metric 'nope_ms' (it has: decode_step_ms",
        ),
        ('{{ profile("h200/nope", "overlap", "step_ms") }}', "no profile named 'h200/nope'"),
        ('{{ profile("h200/stage06_decode_step_b64_cuda", "nope", "step_ms") }}', "no mode 'nope'"),
        ('{{ value("stage05_decode_b1_graphs_h200", "x").real }}', "not allowed in a macro"),
        ('{{ result("stage05_decode_b1_graphs_h200", "decode_step_ms" }}', "not an expression"),
        ('{{ fmt(open("/etc/passwd")) }}', "not allowed in a macro"),
    ],
)
def test_a_bad_macro_names_the_page_line_and_what_exists(numbers, macro: str, message: str) -> None:
    with pytest.raises(docs_numbers.NumbersError) as err:
        docs_numbers.expand(f"intro\n\nthe step: {macro}\n", numbers, "docs/x.md")
    assert str(err.value).startswith("docs/x.md:3: {{") and message in str(err.value)


def test_a_macro_in_code_is_shown_as_written(numbers) -> None:
    shown = '`{{ result("gone", "x") }}` and\n```text\n{{ result("gone", "x") }}\n```\n'
    assert docs_numbers.expand(shown, numbers, "x.md") == shown
    assert docs_numbers.macros(shown) == []


def test_the_hook_fails_the_build_with_the_message(numbers) -> None:
    from mkdocs.exceptions import PluginError

    page = SimpleNamespace(file=SimpleNamespace(src_uri="chapters/x.md"))
    steps = numbers.results["stage05_decode_b1_graphs_h200"].metrics["full_batch_steps"]
    good = '{{ result("stage05_decode_b1_graphs_h200", "full_batch_steps") }} steps'
    assert mkdocs_hooks.on_page_markdown(good, page, {}, None) == f"{steps:.0f} steps"
    assert mkdocs_hooks.on_page_markdown("no macro {{ here }}", page, {}, None) == "no macro {{ here }}"
    with pytest.raises(PluginError, match=r"chapters/x.md:1: .*no result named 'gone'"):
        mkdocs_hooks.on_page_markdown('{{ result("gone", "x") }}', page, {}, None)


def test_chapter_04_reads_its_four_gpu_configurations_from_their_results(tmp_path) -> None:
    """Chapter 04's GPU paragraph quotes the four `bench-ch04` configurations of each GPU's call
    (three runs each): each worst gap as its result has it, and a configuration whose result is
    gone stops the build instead of leaving a sentence without its number."""
    import shutil

    from scripts.results_model import format_metric

    shutil.copytree(ROOT / "benchmarks", tmp_path / "benchmarks")
    chapter = (ROOT / "docs" / "chapters" / "04_chunked_prefill.md").read_text("utf-8")
    numbers = docs_numbers.Numbers.load(tmp_path)
    text = docs_numbers.expand(chapter, numbers, "04")
    assert "the median of three runs each)" in text.split("**What the GPU shows**")[1].split("\n\n")[0]
    for name in ("unchunked", "mixed_2048", "mixed_8192", "prefill_first_8192"):
        h100, h200 = (
            format_metric(numbers.results[f"stage04_long_prompt_{name}_{gpu}"].metrics["short_itl_ms_max"])
            for gpu in ("h100", "h200")
        )
        assert f"{h100} and {h200} ms" in text, name
    (tmp_path / "benchmarks" / "results" / "h100" / "stage04_long_prompt_mixed_8192_h100.json").unlink()
    docs_numbers._load.cache_clear()
    with pytest.raises(docs_numbers.NumbersError, match="stage04_long_prompt_mixed_8192_h100"):
        docs_numbers.expand(chapter, docs_numbers.Numbers.load(tmp_path), "04")
    docs_numbers._load.cache_clear()


# ---------------------------------------------------------------------------------------------
# README.md: figures in a numbers block, written from its template by `make docs-gen`


def test_the_readme_says_what_the_results_say(numbers) -> None:
    """README.md is not built by mkdocs, so its figures are written into it from the template of
    its numbers block; a result that changed, or a figure edited by hand, leaves it stale."""
    readme = (ROOT / "README.md").read_text("utf-8")
    blocks = list(docs_numbers.BLOCK.finditer(readme))
    assert blocks and any("versus_minisgl_h200" in b.group("template") for b in blocks)
    assert all(docs_numbers.macros(b.group("template")) for b in blocks), "a block without a macro"
    fresh = docs_numbers.render_blocks(readme, numbers, "README.md")
    assert fresh == readme, "README.md's numbers blocks are out of date: run make docs-gen"


def test_a_numbers_block_is_written_from_its_template(numbers) -> None:
    name = "versus_minisgl_h200"
    step = numbers.results[name].metrics["latency_final"]
    text = (
        "# Title\n\n<!-- numbers: template (edit here)\n"
        f'The step takes {{{{ result("{name}", "latency_final") }}}} ms\non one H200.\n-->\n\n'
        "The step takes 9.99 ms on one H200.\n\n<!-- /numbers -->\n\nAfter.\n"
    )
    fresh = docs_numbers.render_blocks(text, numbers, "x.md")
    assert fresh.endswith(
        f"-->\n\nThe step takes {step:.2f} ms on one H200.\n\n<!-- /numbers -->\n\nAfter.\n"
    )
    assert docs_numbers.render_blocks(fresh, numbers, "x.md") == fresh
    # The scan reads the template (where a typed number would be found) and not the written text.
    scanned = docs_numbers.block_templates(text)
    assert scanned.count("\n") == text.count("\n") and "9.99" not in scanned and "result(" in scanned
    assert findings("x.md", scanned) == []
    assert [f.split("'")[1] for f in findings("x.md", scanned.replace("{{", "9.99 ms {{", 1))] == ["9.99 ms"]
    with pytest.raises(docs_numbers.NumbersError, match=r"x.md:4: .*no result named 'gone'"):
        docs_numbers.render_blocks(text.replace(name, "gone"), numbers, "x.md")


def test_the_script_checks_and_writes_the_blocks(tmp_path, capsys) -> None:
    import shutil

    shutil.copytree(ROOT / "benchmarks" / "results", tmp_path / "benchmarks" / "results")
    readme = (ROOT / "README.md").read_text("utf-8")
    stale = docs_numbers.BLOCK.sub(lambda m: m.group("head") + "\nstale\n\n" + m.group("end"), readme)
    (tmp_path / "README.md").write_text(stale)
    assert docs_numbers.main(["--check", "--root", str(tmp_path), "README.md"]) == 1
    assert docs_numbers.main(["--root", str(tmp_path), "README.md"]) == 0
    assert (tmp_path / "README.md").read_text() == readme
    assert docs_numbers.main(["--check", "--root", str(tmp_path), "README.md"]) == 0
