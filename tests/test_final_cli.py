"""`python -m final`'s command line: defaults, help, refusals before anything starts, exit codes."""

from __future__ import annotations

import dataclasses
import socket
import subprocess
import sys
from pathlib import Path

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

ROOT = Path(__file__).resolve().parents[1]
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
    # FlashInfer installed, on a GPU whose auto choice is fi (tests/test_final_attention_backends.py
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
