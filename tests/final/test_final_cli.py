"""`python -m final`'s command line: defaults, help, refusals before anything starts, exit codes."""

from __future__ import annotations

import dataclasses
import socket
import subprocess
import sys

import pytest
import torch

from final.__main__ import main as final_main
from final.args import build_parser, parse_args
from final.attention import support
from final.attention.choose import resolve_names
from final.attention.registry import BACKENDS
from final.core.config import EngineConfig
from final.core.errors import UserError
from final.core.flags import flag_fields, flag_name
from final.frontend.options import ServeOptions
from tests import ROOT

FINAL = ROOT / "final"


# ---------------------------------------------------------------------------------------------
# Command line


def test_cli_defaults():
    command = parse_args([])
    engine, options = command.engine, command.options
    assert (engine.model, options.host, options.port, engine.cache, engine.tp, options.shell) == (
        None, "127.0.0.1", 1919, "radix", 1, False,
    )  # fmt: skip
    assert (engine.max_prefill_length, engine.chunk_policy) == (None, "mixed")  # per device: resolve
    assert engine == EngineConfig()  # every default is the field's own
    assert options == ServeOptions()


def test_every_field_is_a_flag_and_its_aliases_are_shown_and_parsed():
    """Flags come from the fields (core/flags.py): a field added to EngineConfig or ServeOptions is
    on the command line, under its own name and its aliases, with nothing written twice."""
    text = " ".join(build_parser().format_help().split())
    for cls in (EngineConfig, ServeOptions):
        for f, flag in flag_fields(cls):
            assert flag_name(f, flag) in text, f"{f.name} has no flag in --help"
    assert {f.name for f in dataclasses.fields(EngineConfig)} == {
        f.name for f, _ in flag_fields(EngineConfig)
    }
    assert "--cache {radix,naive}, --cache-type {radix,naive}" in text
    assert "--tp TP, --tp-size TP" in text
    command = parse_args(["--cache-type", "naive", "--tp-size", "1", "--disable-overlap"])
    assert (command.engine.cache, command.engine.tp, command.engine.overlap) == ("naive", 1, "off")
    # The registries' names are the choices (core/ declares none of them).
    assert "--chunk-policy {mixed,prefill-first}" in text
    assert all(name in text for name in BACKENDS)
    with pytest.raises(SystemExit):
        parse_args(["--overlap", "off", "--disable-overlap"])  # one or the other


def test_server_options_are_typed():
    options = parse_args(
        ["--public-paths", "/health,/docs", "--allowed-origins", "a, b", "--port", "8000"]
    ).options
    assert (options.public_paths, options.allowed_origins, options.port) == (
        ("/health", "/docs"),
        ("a", "b"),
        8000,
    )
    assert parse_args(["--public-paths", "none"]).options.public_paths == ()


def test_cli_help_explains_every_flag():
    text = build_parser().format_help()
    for flag in [
        "--model", "--host", "--port", "--dtype", "--device", "--attn", "--page-size", "--num-pages",
        "--memory-ratio", "--max-running-requests", "--max-prefill-length", "--chunk-policy", "--max-seq-len-override", "--cache",
        "--cuda-graph-max-bs", "--tp", "--shell", "--log-level",
    ]:  # fmt: skip
        assert flag in text, f"--help does not explain {flag}"


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--attn", "flash"], "unknown attention backend 'flash'"),
        (["--shell", "--tp", "0"], "--tp must be >= 1"),
        (["--model", "/no/such/folder"], "not found"),
        (["--attn", "fi", "--device", "cpu"], "CUDA GPUs only"),
    ],
)
def test_cli_refuses_bad_flags_before_starting_anything(argv, needle):
    with pytest.raises(UserError, match=needle):
        final_main(argv)


@pytest.mark.parametrize(
    ("spec", "dtype", "expected"),
    [
        ("auto", torch.bfloat16, ("fi", "fi")),
        ("auto", None, ("fi", "fi")),  # dtype not known yet (--dtype auto is never float32 on CUDA)
        ("auto", torch.float32, ("torch", "torch")),  # FlashInfer has no float32 kernels
        ("fi,torch", torch.float16, ("fi", "torch")),
        ("fi", torch.float32, "needs --dtype bfloat16"),
        ("torch,fi", torch.float32, "needs --dtype bfloat16"),
    ],
)
def test_attention_choice_follows_device_and_dtype(monkeypatch, spec, dtype, expected):
    # FlashInfer installed, on a GPU whose auto choice is fi (tests/final/attention/test_final_attention_backends.py
    # covers the other GPUs and libraries).
    monkeypatch.setattr(support, "installed", lambda module: module == "flashinfer")
    monkeypatch.setattr(
        support, "device_capability", lambda device: (8, 0) if str(device) == "cuda" else None
    )
    if isinstance(expected, str):
        with pytest.raises(UserError, match=expected):
            resolve_names(spec, "cuda", dtype)
    else:
        assert resolve_names(spec, "cuda", dtype) == expected
    assert resolve_names("auto", "cpu", torch.bfloat16) == ("torch", "torch")


def test_cli_errors_are_one_line_and_exit_2():
    proc = subprocess.run(
        [sys.executable, "-m", "final", "--attn", "trtllm"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("error: --attn trtllm") and "Traceback" not in proc.stderr


def test_cli_refuses_a_busy_port_before_loading_the_model():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(UserError, match=f"127.0.0.1:{port}"):
            final_main(["--model", "/no/such/folder", "--port", str(port)])  # the port is checked first


# ---------------------------------------------------------------------------------------------
# vLLM's and SGLang's spellings of the same flags (core/config.py declares them on the fields)


@pytest.mark.parametrize(
    ("argv", "field", "value"),
    [
        (["--max-model-len", "512"], "max_seq_len_override", 512),  # vLLM
        (["--context-length", "512"], "max_seq_len_override", 512),  # SGLang
        (["--gpu-memory-utilization", "0.5"], "memory_ratio", 0.5),  # vLLM
        (["--mem-fraction-static", "0.5"], "memory_ratio", 0.5),  # SGLang
        (["--max-num-batched-tokens", "2048"], "max_prefill_length", 2048),  # vLLM
        (["--chunked-prefill-size", "2048"], "max_prefill_length", 2048),  # SGLang
        (["--max-num-seqs", "64"], "max_running_requests", 64),  # vLLM
        (["--block-size", "16"], "page_size", 16),  # vLLM
        (["--num-gpu-blocks-override", "100"], "num_pages", 100),  # vLLM
        (["--enable-prefix-caching"], "cache", "radix"),  # vLLM
        (["--no-enable-prefix-caching"], "cache", "naive"),  # vLLM
        (["--disable-radix-cache"], "cache", "naive"),  # SGLang
        (["--enforce-eager"], "cuda_graph_max_bs", 0),  # vLLM
        (["--disable-cuda-graph"], "cuda_graph_max_bs", 0),  # SGLang
        (["--disable-overlap-schedule"], "overlap", "off"),  # SGLang
        (["--tensor-parallel-size", "3"], "tp", 3),  # vLLM
        (["-tp", "3"], "tp", 3),  # vLLM
        (["--tp-size", "3"], "tp", 3),  # SGLang
        (["--dtype", "half"], "dtype", "float16"),  # vLLM and SGLang
        (["--dtype", "float"], "dtype", "float32"),
        (["--seed", "7"], "seed", 7),  # vLLM
        (["--random-seed", "7"], "seed", 7),  # SGLang
        (["--trust-remote-code"], "trust_remote_code", True),
        (["--threads", "3"], "threads", 3),
    ],
)
def test_vllm_and_sglang_flag_spellings_set_our_fields(argv, field, value):
    assert getattr(parse_args(argv).engine, field) == value
    text = " ".join(build_parser().format_help().split())
    assert argv[0] in text, f"{argv[0]} is not shown in --help"


@pytest.mark.parametrize(
    ("argv", "field", "value"),
    [
        (["--chat-template", "t.jinja"], "chat_template", "t.jinja"),  # vLLM
        (["--disable-log-requests"], "disable_log_requests", True),  # vLLM
        (["--served-model-name", "m"], "served_model_name", "m"),  # both, as ours
        (["--enable-auto-tool-choice", "--tool-call-parser", "hermes"], "tool_call_parser", "hermes"),  # vLLM
        (["--enable-auto-tool-choice"], "enable_auto_tool_choice", True),
        (["--tool-call-parser", "qwen25"], "tool_call_parser", "hermes"),  # SGLang's name for it
        (["--tool-call-parser", "llama3_json"], "tool_call_parser", "llama3_json"),  # vLLM
        (["--tool-call-parser", "llama3"], "tool_call_parser", "llama3_json"),  # SGLang
        (["--tool-call-parser", "pythonic"], "tool_call_parser", "pythonic"),  # vLLM and SGLang
    ],
)
def test_vllm_server_flags(argv, field, value):
    assert getattr(parse_args(argv).options, field) == value


def test_a_tool_call_format_final_does_not_read_is_refused_with_what_still_works(capsys):
    with pytest.raises(SystemExit) as exit_:
        parse_args(["--tool-call-parser", "mistral"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "Hermes-style <tool_call> blocks" in err and "llama3_json" in err
    assert "tool_choice 'required' or a named function" in err


def test_the_same_spellings_as_llm_keywords():
    """LLM(...) takes what vLLM's LLM takes, through the same declarations."""
    config = EngineConfig.from_kwargs(
        tensor_parallel_size=1, max_model_len=512, gpu_memory_utilization=0.5, enforce_eager=True,
        enable_prefix_caching=False, max_num_seqs=8, max_num_batched_tokens=64, dtype="half",
        seed=3, trust_remote_code=True,
    )  # fmt: skip
    assert (config.tp, config.max_seq_len_override, config.memory_ratio, config.cuda_graph_max_bs) == (
        1,
        512,
        0.5,
        0,
    )
    assert (config.cache, config.max_running_requests, config.max_prefill_length) == ("naive", 8, 64)
    assert (config.dtype, config.seed, config.trust_remote_code) == ("float16", 3, True)
    assert EngineConfig.from_kwargs(enforce_eager=False).cuda_graph_max_bs is None  # nothing asked
    assert EngineConfig.from_kwargs(enable_prefix_caching=True).cache == "radix"
    with pytest.raises(UserError, match="max_model_len and max_seq_len_override set the same option"):
        EngineConfig.from_kwargs(max_model_len=512, max_seq_len_override=256)
    with pytest.raises(UserError, match="unknown engine option.*swap_space.*known:.*tensor_parallel_size"):
        EngineConfig.from_kwargs(swap_space=4)
    with pytest.raises(UserError, match="enforce_eager must be True or False"):
        EngineConfig.from_kwargs(enforce_eager="yes")
