"""The command lines a newcomer meets first: every stage and `python -m final`.

- `--help` parses before torch or transformers is imported (the time itself is a benchmark:
  scripts/bench_startup.py, `make bench-startup`), and the values written out to keep it so
  equal the modules' own;
- a prompt goes through the model's chat template by default (`--raw` sends it as is), with an
  optional `--system`, in every stage;
- stage 03's demo (and 04's) adds its prompts a step apart, so a short shared prefix is reused;
- `--attn fi` on a CPU says the same words in every stage and in final/;
- counts read as English ("1 request", "1 token").
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from transformers import AutoTokenizer

from stages.common import cli
from stages.common.errors import UserError
from stages.common.sampling import SamplingParams
from stages.common.tokenizer import Tokenizer
from tests.stage_list import ROOT, STAGES, load

ENGINES = [f"stages.{s}" for s in STAGES] + ["final"]


# ---------------------------------------------------------------------------------------------
# --help imports nothing heavy


@pytest.mark.parametrize("module", ENGINES)
def test_help_imports_neither_torch_nor_transformers(module):
    code = (
        "import runpy, sys\n"
        "try:\n"
        f"    runpy.run_module({module!r}, run_name='__main__', alter_sys=True)\n"
        "except SystemExit:\n"
        "    pass\n"
        "heavy = sorted(m for m in ('torch', 'transformers', 'tokenizers') if m in sys.modules)\n"
        "print('HEAVY', ','.join(heavy))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, "--help"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert "usage: python -m" in proc.stdout
    assert proc.stdout.strip().splitlines()[-1] == "HEAVY", (
        f"--help of {module} imported: {proc.stdout[-200:]}"
    )


def test_values_written_out_for_a_fast_help_equal_the_modules_own():
    main04 = load("stages.04_chunked_prefill.__main__")
    scheduler04 = load("stages.04_chunked_prefill.scheduler")
    assert main04.MAX_PREFILL_LENGTH == scheduler04.DEFAULT_MAX_PREFILL_LENGTH
    assert main04.CHUNK_POLICIES == scheduler04.POLICIES
    # final/ writes no value out: its --help reads the registries themselves, which import no torch.


@pytest.mark.parametrize("stage", STAGES)
def test_help_shows_the_defaults_and_the_shared_flags(stage, capsys):
    main = load(f"stages.{stage}.__main__")
    with pytest.raises(SystemExit):
        main.parse_args(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "most tokens to generate per prompt; 0: no cap" in text and "(default: 128)" in text
    assert "0 is greedy (default: 0.0)" in text
    assert "--raw" in text and "--system" in text
    args = main.parse_args(["--prompt", "x"])
    assert args.max_tokens == 128 and args.chat is None and args.system is None


# ---------------------------------------------------------------------------------------------
# The chat template by default


@pytest.fixture(scope="module")
def tiny_tokenizer(tiny_llama_dir):
    return Tokenizer(tiny_llama_dir), AutoTokenizer.from_pretrained(str(tiny_llama_dir))


@pytest.mark.parametrize("stage", STAGES)
def test_every_stage_wraps_prompts_in_the_chat_template_by_default(stage, tiny_tokenizer):
    ours, hf = tiny_tokenizer
    main = load(f"stages.{stage}.__main__")
    question = "What is the capital of France?"
    system = "Answer in one word."

    def template(messages):
        return list(
            hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
        )

    user = [{"role": "user", "content": question}]
    default = cli.encode_prompts(ours, [question], main.parse_args(["--prompt", question]))
    assert default == [template(user)]
    chat = cli.encode_prompts(ours, [question], main.parse_args(["--prompt", question, "--chat"]))
    assert chat == default
    with_system = main.parse_args(["--prompt", question, "--system", system])
    assert cli.encode_prompts(ours, [question], with_system) == [
        template([{"role": "system", "content": system}, *user])
    ]
    raw = cli.encode_prompts(ours, [question], main.parse_args(["--prompt", question, "--raw"]))
    assert raw == [hf.encode(question)]
    with pytest.raises(UserError, match="drop --raw"):
        cli.encode_prompts(
            ours, [question], main.parse_args(["--prompt", question, "--raw", "--system", system])
        )
    with pytest.raises(SystemExit):
        main.parse_args(["--prompt", question, "--raw", "--chat"])


def test_a_model_without_a_chat_template_gets_raw_text(tiny_tokenizer):
    ours, hf = tiny_tokenizer
    ours.hf.chat_template = None
    try:
        assert ours.encode_prompt("Hello") == hf.encode("Hello")
        with pytest.raises(UserError, match="no chat template"):
            ours.encode_prompt("Hello", chat=True)
        with pytest.raises(UserError, match="this model has none"):
            ours.encode_prompt("Hello", system="Be brief.")
    finally:
        ours.hf.chat_template = hf.chat_template


@pytest.mark.slow
def test_stage01_answers_a_bare_question_with_the_default_model(default_model_dir):
    """The newcomer's first command: no --chat, and the instruct model still answers."""
    proc = subprocess.run(
        [sys.executable, "-m", "stages.01_naive_generate", "--model", str(default_model_dir), "--device", "cpu",
         "--prompt", "What is the capital of France?", "--max-tokens", "24"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "Paris" in proc.stdout
    assert "finish: stop" in proc.stderr


# ---------------------------------------------------------------------------------------------
# Stage 03's demo shows reuse


@pytest.mark.parametrize("stage", ["03_radix_cache", "04_chunked_prefill"])
def test_demo_reuses_a_short_shared_prefix_unless_prompts_arrive_together(stage, tiny_llama_dir, capsys):
    main = load(f"stages.{stage}.__main__").main
    # A short system prompt: fewer shared tokens than the scheduler waits for within one step.
    argv = ["--model", str(tiny_llama_dir), "--device", "cpu", "--max-tokens", "2", "--system", "Be brief.",
            "--prompt", "The cat sat.", "--prompt", "A dog ran."]  # fmt: skip
    cached = {}
    for extra in ([], ["--stagger", "0"]):  # the default, then all prompts in the first step
        assert main([*argv, *extra]) == 0
        out = capsys.readouterr().out
        lines = [line for line in out.splitlines() if line.startswith("--- [1]")]
        cached[" ".join(extra)] = int(lines[0].split("(")[-1].split()[0])
    assert cached[""] > 0, "by default the second prompt should find the system prompt in the cache"
    assert cached["--stagger 0"] == 0, "prompts admitted in the same step should not wait for a short prefix"


def test_staggered_arrivals_give_the_same_greedy_tokens(tiny_llama_dir):
    stage03 = load("stages.03_radix_cache")
    llm = stage03.LLM(str(tiny_llama_dir), device="cpu", dtype="float32")
    prompts = [llm.tokenizer.encode(t) for t in ("The cat sat on", "The cat sat on the mat and", "A dog")]
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    together = [o.token_ids for o in llm.generate(prompts, params)]
    fresh = stage03.LLM(str(tiny_llama_dir), device="cpu", dtype="float32")
    staggered = cli.generate_staggered(fresh, prompts, params, every=2)
    assert [o.token_ids for o in staggered] == together
    assert staggered[1].cached_tokens > 0  # it arrived after the first had cached "The cat sat on"


# ---------------------------------------------------------------------------------------------
# One message for --attn fi on a CPU; counts in English


CPU_FI = "--attn fi runs on CUDA GPUs only; use --attn torch on the CPU"


@pytest.mark.parametrize("stage", [s for s in STAGES if s >= "02"])
def test_attn_fi_on_a_cpu_says_it_needs_a_cuda_gpu(stage, tiny_llama_dir):
    main = load(f"stages.{stage}.__main__").main
    for dtype in ("auto", "bfloat16"):
        with pytest.raises(UserError) as err:
            main(
                [
                    "--model",
                    str(tiny_llama_dir),
                    "--device",
                    "cpu",
                    "--dtype",
                    dtype,
                    "--attn",
                    "fi",
                    "--prompt",
                    "hi",
                ]
            )
        assert str(err.value) == CPU_FI


def test_final_attn_fi_on_a_cpu_says_the_same():
    from final.core.config import EngineConfig
    from final.core.errors import UserError as FinalUserError
    from final.engine.resolve import validate_early

    for dtype in ("auto", "bfloat16"):
        with pytest.raises(FinalUserError) as err:
            validate_early(EngineConfig(attn="fi", device="cpu", dtype=dtype))
        assert str(err.value) == CPU_FI


def test_counts_read_as_english(tiny_llama_dir, capsys):
    assert (cli.plural(1, "request"), cli.plural(2, "request"), cli.plural(0, "token")) == (
        "1 request",
        "2 requests",
        "0 tokens",
    )
    main = load("stages.02_paged_kv.__main__").main
    assert (
        main(["--model", str(tiny_llama_dir), "--device", "cpu", "--max-tokens", "1", "--prompt", "hi"]) == 0
    )
    err = capsys.readouterr().err
    assert "] 1 request, 1 token in " in err
