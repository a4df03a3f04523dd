"""Self-tests of the tiny checkpoints, the offline tokenizer and the HF oracle.

Everything else is tested against these, so they must be right: deterministic, loadable by
transformers, exercising the features the engine must honour, and with logits spread widely
enough that greedy comparisons are meaningful.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors import safe_open
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from tests import ROOT as REPO_ROOT
from tests.fixtures.tiny_models import (
    _greedy_steps,
    hf_greedy,
    hf_logits,
    hf_step_logprobs,
    make_tiny_checkpoint,
    sample_prompts,
    train_tiny_tokenizer,
)

MULTI_BYTE_TEXTS = [
    "Hello, world! 123 + 456 = 579.",
    "café naïve façade jalapeño",
    "日本 東京",
    "a robot 🙂👋 waves",
    "  leading spaces,\ttabs\nand newlines  ",
    "never seen: Ωμέγα ЖЖЖ ﷺ 𝔘𝔫𝔦",  # characters absent from the training corpus
]


def _tensor_names(model_dir: Path) -> set[str]:
    with safe_open(str(model_dir / "model.safetensors"), framework="pt") as f:
        return set(f.keys())


# --- tokenizer -----------------------------------------------------------------------------


def test_tokenizer_round_trips_multi_byte_text(tiny_tokenizer_dir: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_tokenizer_dir)
    assert 400 <= len(tokenizer) <= 512
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|endoftext|>"
    assert tokenizer.bos_token is None
    for text in MULTI_BYTE_TEXTS:
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert tokenizer.decode(ids) == text
    # Merges were learned: common words take fewer tokens than bytes.
    assert len(tokenizer.encode("The cat reads the first page.")) < len("The cat reads the first page.") / 2
    # Special tokens are single ids, not spelled out.
    assert tokenizer.encode("<|im_start|><|im_end|>") == [1, 2]


def test_chat_template_renders_chatml(tiny_tokenizer_dir: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_tokenizer_dir)
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi?"},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "café?"},
    ]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi?<|im_end|>\n"
        "<|im_start|>assistant\nHello.<|im_end|>\n<|im_start|>user\ncafé?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    without_prompt = tokenizer.apply_chat_template(messages[:2], tokenize=False)
    assert without_prompt.endswith("Hi?<|im_end|>\n")
    with pytest.raises(Exception, match="Unknown chat role"):
        tokenizer.apply_chat_template([{"role": "tool", "content": "x"}], tokenize=False)


def test_tokenizer_training_is_deterministic(tmp_path: Path, tiny_tokenizer_dir: Path) -> None:
    train_tiny_tokenizer(tmp_path)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (tmp_path / name).read_bytes() == (tiny_tokenizer_dir / name).read_bytes()


def test_padded_vocab_decodes_every_id(tmp_path: Path) -> None:
    train_tiny_tokenizer(tmp_path, pad_vocab_to=1000)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    assert len(tokenizer) == 1000
    every_id = list(range(1000))
    assert None not in tokenizer.convert_ids_to_tokens(every_id)
    assert tokenizer.decode([999]) == "<|reserved_999|>"
    # Padding adds ids; it does not change how text encodes.
    assert max(tokenizer.encode(MULTI_BYTE_TEXTS[1])) < 512


def test_sample_prompts_are_varied_and_deterministic(tiny_tokenizer_dir: Path) -> None:
    prompts = sample_prompts(tiny_tokenizer_dir, 20, seed=3)
    assert prompts == sample_prompts(tiny_tokenizer_dir, 20, seed=3)
    assert prompts != sample_prompts(tiny_tokenizer_dir, 20, seed=4)
    lengths = [len(p) for p in prompts]
    assert min(lengths) == 1 and max(lengths) == 60
    assert len(set(lengths)) >= 10
    assert all(0 <= t < 512 for p in prompts for t in p)


# --- checkpoints ---------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ["qwen3", "llama", "qwen2", "mistral"])
def test_checkpoint_loads_and_has_its_features(arch: str, request: pytest.FixtureRequest) -> None:
    model_dir: Path = request.getfixturevalue(f"tiny_{arch}_dir")
    config = AutoConfig.from_pretrained(model_dir)
    assert (config.hidden_size, config.num_hidden_layers, config.head_dim) == (64, 2, 16)
    assert (config.num_attention_heads, config.num_key_value_heads) == (4, 2)
    assert config.eos_token_id == 2 and config.bos_token_id is None
    assert config.vocab_size == len(AutoTokenizer.from_pretrained(model_dir))

    names = _tensor_names(model_dir)
    assert ("lm_head.weight" not in names) == (arch == "llama")  # only Llama is tied
    assert any(n.endswith("self_attn.q_proj.bias") for n in names) == (arch == "qwen2")
    assert any(n.endswith("self_attn.q_norm.weight") for n in names) == (arch == "qwen3")

    # Nothing is left at HF's init: norms are noisy around 1, biases non-zero.
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    for name, param in model.named_parameters():
        assert param.std() > 0.05, name
        if "norm" in name:
            assert 0.9 < param.mean() < 1.1, name


def test_checkpoint_is_deterministic(tmp_path: Path, tiny_qwen3_dir: Path) -> None:
    make_tiny_checkpoint(tmp_path / "again", "qwen3")
    make_tiny_checkpoint(tmp_path / "seed1", "qwen3", seed=1)
    weights = (tiny_qwen3_dir / "model.safetensors").read_bytes()
    assert (tmp_path / "again" / "model.safetensors").read_bytes() == weights
    assert (tmp_path / "seed1" / "model.safetensors").read_bytes() != weights


def test_rope_scaling_override_lands_in_rope_parameters(tmp_path: Path) -> None:
    llama3 = {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    }
    make_tiny_checkpoint(tmp_path, "llama", num_hidden_layers=1, rope_scaling=llama3)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["num_hidden_layers"] == 1
    assert saved["rope_parameters"] == {**llama3, "rope_theta": 10000.0}
    assert hf_greedy(tmp_path, [[5, 6, 7]], 3)[0] != []


# --- the oracle ----------------------------------------------------------------------------


def test_hf_greedy_matches_full_recompute(tiny_model_dir: Path, tiny_tokenizer_dir: Path) -> None:
    prompts = sample_prompts(tiny_tokenizer_dir, 3, seed=0)
    outputs = hf_greedy(tiny_model_dir, prompts, 8)
    assert [len(o) for o in outputs] == [8, 8, 8]
    # The KV-cached loop agrees with recomputing the whole sequence at every step.
    ids = list(prompts[1])
    for _ in range(8):
        ids.append(int(hf_logits(tiny_model_dir, ids)[-1].argmax()))
    assert ids[len(prompts[1]) :] == outputs[1]


def test_step_logprobs_agree_with_greedy_and_logits(tiny_model_dir: Path, tiny_tokenizer_dir: Path) -> None:
    prompt = sample_prompts(tiny_tokenizer_dir, 1, seed=5)[0]
    logprobs = hf_step_logprobs(tiny_model_dir, prompt, 6)
    assert len(logprobs) == 6 and all(lp.shape == (512,) and lp.dtype == torch.float32 for lp in logprobs)
    assert [int(lp.argmax()) for lp in logprobs] == hf_greedy(tiny_model_dir, [prompt], 6)[0]
    for lp in logprobs:
        assert torch.logsumexp(lp, dim=-1).abs() < 1e-5
    logits = hf_logits(tiny_model_dir, prompt)
    assert logits.shape == (len(prompt), 512)
    torch.testing.assert_close(logprobs[0], torch.log_softmax(logits[-1], dim=-1), atol=1e-5, rtol=0)


def test_top2_logit_gaps_are_not_tiny(tiny_model_dir: Path, tiny_tokenizer_dir: Path) -> None:
    gaps = []
    for prompt in sample_prompts(tiny_tokenizer_dir, 4, seed=1):
        for logprobs in hf_step_logprobs(tiny_model_dir, prompt, 8):
            top2 = logprobs.topk(2).values
            gaps.append(float(top2[0] - top2[1]))
    gaps_t = torch.tensor(gaps)
    assert (gaps_t > 1e-3).float().mean() >= 0.95
    assert gaps_t.median() > 0.05


class _AlwaysEos(torch.nn.Module):
    """A stand-in model whose argmax is always EOS (id 2)."""

    def forward(
        self, input_ids: torch.Tensor, past_key_values: object = None, use_cache: bool = True
    ) -> SimpleNamespace:
        logits = torch.zeros(1, input_ids.shape[1], 8)
        logits[..., 2] = 1.0
        return SimpleNamespace(logits=logits, past_key_values=None)


def test_greedy_does_not_stop_at_eos() -> None:
    new_ids, step_logits = _greedy_steps(_AlwaysEos(), [5, 6], 5)  # type: ignore[arg-type]
    assert new_ids == [2] * 5 and len(step_logits) == 5


# --- the script ----------------------------------------------------------------------------


def test_make_random_checkpoint_script_tiny(tmp_path: Path, tiny_qwen3_dir: Path) -> None:
    out = tmp_path / "ckpt"
    result = subprocess.run(
        [sys.executable, "-m", "scripts.make_random_checkpoint", "--shape", "tiny-qwen3", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO_ROOT,  # as the docs run it: a module of the scripts package, from the root
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},  # nothing but the root
    )
    assert result.returncode == 0, result.stderr
    # Same seed, same shape: the very checkpoint the fixture built.
    assert (out / "model.safetensors").read_bytes() == (tiny_qwen3_dir / "model.safetensors").read_bytes()
    assert AutoConfig.from_pretrained(out).model_type == "qwen3"


def test_a_checkpoint_cut_off_while_writing_its_weights_has_no_config(tmp_path: Path, monkeypatch) -> None:
    # gpu_run.sh's `ckpt` steps skip a folder that has a config.json: one written before the
    # weights would make a cut-off run look like a whole checkpoint on the next call.
    from scripts import make_random_checkpoint as script

    def cut_off(path, *args, **kwargs):
        path.write_bytes(b"half a tensor")
        raise KeyboardInterrupt

    monkeypatch.setattr(script, "write_random_safetensors", cut_off)
    with pytest.raises(KeyboardInterrupt):
        script.make_qwen3("qwen3-0.6b", tmp_path / "ckpt", torch.bfloat16, seed=0)
    assert (tmp_path / "ckpt" / "model.safetensors").exists()
    assert not (tmp_path / "ckpt" / "config.json").exists()
