"""Sampling defaults (final/frontend/sampling_defaults.py), the shell's /set, and the offline
LLM's chat() and default parameters, without a server.

The order under test: a request's own value, then the command line, then the model's
generation_config.json, then the built-in value; a default max_tokens shrinks to the room left.
"""

from __future__ import annotations

import json
import shutil

import pytest
from transformers import AutoTokenizer

from final import LLM, SamplingParams
from final.args import parse_args
from final.core.errors import UserError
from final.frontend.sampling_defaults import (
    API_FALLBACK,
    SHELL_FALLBACK,
    SamplingDefaults,
    fit_default_max_tokens,
    read_generation_config,
    resolve_sampling_defaults,
    sampling_flags,
)
from final.shell.shell import HELP, Shell


def write_generation_config(folder, **values) -> None:
    path = folder / "generation_config.json"
    config = json.loads(path.read_text()) if path.exists() else {}
    path.write_text(json.dumps({**config, **values}))


# ---------------------------------------------------------------------------------------------
# Reading generation_config.json


def test_generation_config_fields_are_read_as_sampling_params(tmp_path):
    assert read_generation_config(tmp_path) == {}  # no file: nothing
    write_generation_config(
        tmp_path, do_sample=True, temperature=0.6, top_p=0.95, top_k=20, min_p=0.05, max_new_tokens=64.0,
        repetition_penalty=1.1, bos_token_id=1, eos_token_id=[2, 3],
    )  # fmt: skip
    assert read_generation_config(tmp_path) == {
        "temperature": 0.6,
        "top_p": 0.95,
        "top_k": 20,
        "min_p": 0.05,
        "max_tokens": 64,
    }
    write_generation_config(tmp_path, temperature=True)  # a bool is not a temperature
    assert "temperature" not in read_generation_config(tmp_path)


def test_a_broken_generation_config_is_a_clear_error(tmp_path):
    (tmp_path / "generation_config.json").write_text("{not json")
    with pytest.raises(UserError, match="--generation-config none"):
        read_generation_config(tmp_path)
    assert resolve_sampling_defaults(tmp_path, "none").sources["temperature"] == "built-in"


# ---------------------------------------------------------------------------------------------
# The order: flag > generation_config.json > built-in


def test_flags_beat_the_generation_config_which_beats_the_built_in(tmp_path):
    write_generation_config(tmp_path, temperature=0.6, top_k=20, max_new_tokens=64)
    flags = {"temperature": 0.2, "top_p": None, "top_k": None, "min_p": None, "max_tokens": None}
    defaults = resolve_sampling_defaults(tmp_path, "auto", flags)
    assert dict(defaults.values) == {
        "temperature": 0.2,
        "top_p": 1.0,
        "top_k": 20,
        "min_p": 0.0,
        "max_tokens": 64,
    }
    assert defaults.sources == {
        "temperature": "--temperature",
        "top_p": "built-in",
        "top_k": "generation_config.json",
        "min_p": "built-in",
        "max_tokens": "generation_config.json",
    }
    assert "top_k 20 (generation_config.json)" in defaults.describe()
    # none: the file is not read; the built-in values of the face apply
    plain = resolve_sampling_defaults(tmp_path, "none")
    assert dict(plain.values) == API_FALLBACK
    shell = resolve_sampling_defaults(tmp_path, "none", fallback=SHELL_FALLBACK)
    assert shell.values["temperature"] == 0.0 and shell.values["max_tokens"] == API_FALLBACK["max_tokens"]
    # a folder: its file instead of the model's
    other = tmp_path / "other"
    other.mkdir()
    write_generation_config(other, top_p=0.5)
    assert dict(resolve_sampling_defaults(tmp_path, str(other)).values) == {**API_FALLBACK, "top_p": 0.5}
    with pytest.raises(UserError, match="no such folder"):
        resolve_sampling_defaults(tmp_path, str(tmp_path / "missing"))


def test_max_tokens_zero_means_no_cap_and_bad_values_name_their_source(tmp_path):
    defaults = resolve_sampling_defaults(tmp_path, "auto", {"max_tokens": 0})
    assert defaults.values["max_tokens"] is None and "max_tokens no cap (--max-tokens)" in defaults.describe()
    with pytest.raises(UserError, match=r"top_p must be in \(0, 1\].*from --top-p"):
        resolve_sampling_defaults(tmp_path, "auto", {"top_p": 0.0})
    write_generation_config(tmp_path, temperature=-1)
    with pytest.raises(
        UserError, match="temperature must be a finite number >= 0.*from generation_config.json"
    ):
        resolve_sampling_defaults(tmp_path)


def test_sampling_flags_come_from_the_command_line():
    args = parse_args(["--temperature", "0.3", "--max-tokens", "0", "--generation-config", "none"]).options
    assert sampling_flags(args) == {
        "temperature": 0.3,
        "top_p": None,
        "top_k": None,
        "min_p": None,
        "max_tokens": 0,
    }
    assert args.generation_config == "none"
    with pytest.raises(SystemExit):
        parse_args(["--max-tokens", "-1"])


def test_what_a_request_gives_wins_and_other_fields_pass_through():
    defaults = SamplingDefaults({**API_FALLBACK, "temperature": 0.6, "top_k": 20}, {})
    params = defaults.params(temperature=None, top_k=5, max_tokens=None, seed=7, stop=["\n"])
    assert (params.temperature, params.top_k, params.max_tokens, params.seed, params.stop) == (
        0.6,
        5,
        API_FALLBACK["max_tokens"],
        7,
        ["\n"],
    )
    assert defaults.params(temperature=0).temperature == 0  # 0 is a value, not "left out"


def test_a_default_max_tokens_shrinks_to_the_room_left():
    params = SamplingParams(max_tokens=256)
    # context 100, prompt 90: 10 tokens of room
    assert fit_default_max_tokens(params, [1] * 90, 100, 1000, 10_000).max_tokens == 10
    # a KV pool smaller than the context: the pool decides
    assert fit_default_max_tokens(params, [1] * 90, 1000, 1000, 120).max_tokens == 30
    assert fit_default_max_tokens(params, [1] * 10, 1000, 1000, 10_000).max_tokens == 256
    assert (
        fit_default_max_tokens(SamplingParams(max_tokens=None), [1] * 10, 100, 1000, 10_000).max_tokens == 90
    )
    # no room at all: unchanged, for the engine's own check to refuse with its message
    assert fit_default_max_tokens(params, [1] * 100, 100, 1000, 10_000).max_tokens == 256


# ---------------------------------------------------------------------------------------------
# The shell's /set (the pseudo-terminal test in test_final_shell.py drives it for real)


def test_shell_set_changes_validates_and_shows_the_settings(capsys):
    shell = Shell(None, None, None, SamplingDefaults(dict(SHELL_FALLBACK), {}))  # type: ignore[arg-type]
    assert shell.params().temperature == 0.0
    shell.command("/set temperature 0.7")
    shell.command("/set top_p 0")  # refused: the old value stays
    shell.command("/set top_k many")
    shell.command("/set colour blue")
    out = capsys.readouterr().out
    assert "(temperature = 0.7)" in out and "top_p must be in (0, 1]" in out
    assert "top_k takes a number" in out and "usage: /set NAME VALUE" in out
    params = shell.params()
    assert (params.temperature, params.top_p) == (0.7, 1.0)
    shell.command("/set max_tokens 0")
    assert shell.params().max_tokens is None  # no cap: the room left decides
    shell.command("/set")
    listing = capsys.readouterr().out
    assert "temperature = 0.7  (/set)" in listing and "top_p = 1.0  (built-in)" in listing
    assert "max_tokens = no cap  (/set)" in listing
    assert "/set NAME VALUE" in HELP and "temperature" in HELP


# ---------------------------------------------------------------------------------------------
# The offline API: chat() and defaults from generation_config.json


@pytest.fixture(scope="module")
def llm(tiny_qwen3_dir):
    return LLM(str(tiny_qwen3_dir), device="cpu", dtype="float32", num_pages=512)


GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is the capital of France?"},
]


def test_chat_applies_the_chat_template_as_transformers_does(llm, tiny_qwen3_dir):
    hf = AutoTokenizer.from_pretrained(str(tiny_qwen3_dir))
    expected = list(
        hf.apply_chat_template(CONVERSATION, add_generation_prompt=True, tokenize=True, return_dict=False)
    )
    (out,) = llm.chat(CONVERSATION, GREEDY, progress=False)
    assert out.prompt_ids == expected
    (same,) = llm.generate([expected], GREEDY, progress=False)
    assert out.token_ids == same.token_ids and len(out.token_ids) == 8
    other = [{"role": "user", "content": "Hello"}]
    both = llm.chat([CONVERSATION, other], GREEDY, progress=False)  # several conversations, in order
    assert [o.token_ids for o in both] == [
        out.token_ids,
        llm.chat(other, GREEDY, progress=False)[0].token_ids,
    ]
    with pytest.raises(UserError, match="at least one message"):
        llm.chat([], GREEDY)


def test_llm_defaults_come_from_the_generation_config(tiny_qwen3_dir, tmp_path):
    folder = tmp_path / "model"
    shutil.copytree(tiny_qwen3_dir, folder)
    write_generation_config(folder, top_k=1, max_new_tokens=5)  # top_k 1 is greedy
    llm = LLM(str(folder), device="cpu", dtype="float32", num_pages=512)
    defaults = llm.get_default_sampling_params()
    assert (defaults.top_k, defaults.max_tokens, defaults.temperature) == (1, 5, 1.0)
    prompt = llm.tokenizer.encode("The cat sat on the")
    (without,) = llm.generate([prompt], progress=False)
    (greedy,) = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=5), progress=False)
    assert without.token_ids == greedy.token_ids
    plain = LLM(str(folder), device="cpu", dtype="float32", num_pages=512, generation_config="none")
    assert plain.get_default_sampling_params().top_k == -1


@pytest.mark.slow
def test_default_model_chats_offline(default_model_dir):
    llm = LLM(str(default_model_dir), device="cpu")
    (out,) = llm.chat(
        [{"role": "user", "content": "What is the capital of France?"}],
        SamplingParams(temperature=0, max_tokens=24),
        progress=False,
    )
    assert "Paris" in out.text and out.finish_reason == "stop"
