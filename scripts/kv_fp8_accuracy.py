"""An FP8 KV cache against the model's own dtype: how often greedy decoding still agrees, and how far
the chosen tokens' log-probabilities move (issue 32).

    python -m scripts.kv_fp8_accuracy --model-tag smollm2                      # default model, CPU, torch
    python -m scripts.kv_fp8_accuracy --model-tag smollm2 --scales calibrated  # per-layer amax/448 scales
    python -m scripts.kv_fp8_accuracy --model-tag smollm2 --kv-cache-dtype bf16  # the yardstick: bf16
    python -m scripts.kv_fp8_accuracy --model checkpoints/qwen3-0.6b-random --model-tag qwen306b \\
        --device cuda --attn fi --out benchmarks/results/h200

The same prompts go through two engines, one whose KV cache holds the model's dtype (float32 on
the CPU, bf16 on a GPU) and one with `--kv-cache-dtype fp8_e4m3`; each answers greedily with
`--tokens` tokens (EOS ignored) and the top-5 log-probabilities of every step. Per prompt, d is
the first step where the two answers differ (`--tokens` if none). Reported:

- greedy_agreement: the share of prompts whose `--tokens` tokens are all the same;
- agreed_token_share: the mean of d / tokens (how far the answers stay together);
- abs_dlogprob_mean / _p99 / _max: |log p_fp8(t) - log p_ref(t)| of the reference's chosen token t
  at steps 0..d, where both engines had the same context (past d their contexts differ and the
  log-probabilities are not comparable); at step d, t's log-probability under FP8 is read from
  its top 5 (the rare step where t is not among them is left out, and counted).

Prompts are windows of benchmarks/data/kv_fp8_corpus.txt (prose of the book's chapters, frozen
so results stay comparable as the book changes), of lengths log-uniform in [--min-len,
--max-len] tokens, every other one wrapped in the chat template as a request to continue it.
`--scales calibrated` measures each layer's largest |K| and |V| on other prompts of the same
corpus with the reference engine and gives the FP8 engine amax / 448 through a copy of the
checkpoint carrying `k_scale`/`v_scale` tensors (models/kv_scales.py): the trade-off against
the default scales of 1.0 that kvcache/pool.py explains. `--kv-cache-dtype bf16` measures a bf16
cache the same way (for a float32 model: on the CPU): how far a rounding 16 times finer than
FP8's already moves greedy answers, the yardstick to read FP8's numbers against.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import math
import random
import re
import shlex
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from tqdm import tqdm

import final
from final.core.sampling_params import SamplingParams
from final.frontend.tokenizer import Tokenizer
from final.kernels.kv_write import FP8_E4M3_MAX
from final.models.source import resolve_model
from stages.common.bench import percentile, stamp_run_id
from stages.common.hardware import describe, device_tag, versions

ROOT = Path(__file__).resolve().parents[1]

CORPUS = ROOT / "benchmarks" / "data" / "kv_fp8_corpus.txt"
TOP_K = 5
GPU_KV_TOKENS = 262_144  # each engine's pool on a GPU: both run in this process, one after the other


def build_prompts(
    tokenizer: Tokenizer, n: int, seed: int, min_len: int, max_len: int, corpus: str | None = None
) -> list[list[int]]:
    """`n` prompts: windows of the corpus's tokens, log-uniform lengths, every other one chatted."""
    ids = tokenizer.encode(corpus if corpus is not None else CORPUS.read_text())
    rng = random.Random(seed)
    prompts = []
    for i in range(n):
        length = min(round(math.exp(rng.uniform(math.log(min_len), math.log(max_len)))), len(ids))
        start = rng.randrange(0, len(ids) - length + 1)
        window = ids[start : start + length]
        if i % 2:
            text = "Continue this text:\n\n" + tokenizer.decode(window)
            window = tokenizer.encode_chat([{"role": "user", "content": text}])
        prompts.append(window)
    return prompts


def serve(llm: final.LLM, prompts: list[list[int]], params: SamplingParams, desc: str, progress: bool):
    """Every prompt's output, in order, with a progress bar over finished requests."""
    order = {llm.add_request(p, params): i for i, p in enumerate(prompts)}
    outputs: list[Any] = [None] * len(prompts)
    with tqdm(total=len(prompts), desc=desc, unit="req", disable=not progress) as bar:
        while llm.has_unfinished():
            for rid, out in llm.step():
                outputs[order[rid]] = out
                bar.update(1)
    return outputs


def compare(reference: list[Any], fp8: list[Any], tokens: int) -> dict[str, float]:
    """The metrics of the module docstring, from two runs' outputs (token_ids and top-k logprobs)."""
    agreed, deltas, missing = [], [], 0
    for ref, got in zip(reference, fp8, strict=True):
        a, b = ref.token_ids[:tokens], got.token_ids[:tokens]
        d = next((j for j, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), len(a))
        agreed.append(d / len(a))
        for j in range(min(d + 1, len(a))):  # steps with the same context; d itself included
            want = ref.logprobs[j]["token_logprob"]
            theirs = dict(zip(got.logprobs[j]["top_ids"], got.logprobs[j]["top_logprobs"], strict=True))
            if a[j] not in theirs:
                missing += 1
                continue
            deltas.append(abs(theirs[a[j]] - want))
    return {
        "greedy_agreement": sum(share == 1.0 for share in agreed) / len(agreed),
        "agreed_token_share": sum(agreed) / len(agreed),
        "abs_dlogprob_mean": sum(deltas) / len(deltas),
        "abs_dlogprob_p99": percentile(deltas, 99),
        "abs_dlogprob_max": max(deltas),
        "compared_tokens": len(deltas),
        "left_out_tokens": missing,
        "prompts": len(agreed),
    }


def calibrate(llm: final.LLM) -> dict[str, torch.Tensor]:
    """k_scale/v_scale tensors, checkpoint-named: each layer's largest |K| and |V| in the pool of
    `llm` (a fresh engine of the model's dtype that has served only the calibration prompts: the
    rest of its pool is zeros) over e4m3's largest value, 448."""
    pool = llm.core.executor.runner.pool
    tensors = {}
    for layer in range(pool.k.shape[0]):
        for which, cache in (("k", pool.k[layer]), ("v", pool.v[layer])):
            amax = float(cache.float().abs().max())
            scale = torch.tensor(max(amax, 1e-6) / FP8_E4M3_MAX, dtype=torch.float32)
            tensors[f"model.layers.{layer}.self_attn.{which}_scale"] = scale
    return tensors


def with_scales(folder: Path, tensors: dict[str, torch.Tensor], out: Path) -> Path:
    """A copy of the checkpoint `folder` (links to its files) that also carries `tensors`."""
    out.mkdir(parents=True, exist_ok=True)
    for item in folder.iterdir():
        (out / item.name).symlink_to(item.resolve())
    save_file(tensors, str(out / "kv_scales.safetensors"))
    return out


def engine(folder: Path, args: argparse.Namespace, kv_cache_dtype: str) -> final.LLM:
    on_gpu = device_tag(args.device) != "cpu"
    kv_tokens = args.kv_tokens or (GPU_KV_TOKENS if on_gpu else None)
    extra: dict[str, Any] = {"page_size": args.page_size} if args.page_size else {}
    if kv_tokens:
        extra["num_pages"] = kv_tokens // (args.page_size or 1)
    return final.LLM(
        str(folder), device=args.device, dtype=args.dtype, attn=args.attn, kv_cache_dtype=kv_cache_dtype,
        max_running_requests=args.max_running, **extra,
    )  # fmt: skip


def free_memory() -> None:
    """After `llm.close(); del llm`: free the engine's memory before the next one is built (its
    objects refer to each other, so only the collector frees them)."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    folder = resolve_model(args.model)
    tokenizer = Tokenizer(folder)
    prompts = build_prompts(tokenizer, args.prompts, args.seed, args.min_len, args.max_len)
    params = SamplingParams(temperature=0, max_tokens=args.tokens, ignore_eos=True, logprobs=TOP_K)
    progress = not args.no_progress
    reference = engine(folder, args, "auto")
    model_dtype = str(reference.dtype).removeprefix("torch.")
    attn = reference.core.info().attn  # what `auto` resolved to
    if args.kv_cache_dtype == "bf16" and reference.dtype == torch.bfloat16:
        raise SystemExit(
            "--kv-cache-dtype bf16 of a bf16 model is its own cache: use a float32 model (--dtype)"
        )
    scales: dict[str, torch.Tensor] = {}
    if args.scales == "calibrated":  # on other prompts, before the pool holds any of the measured ones
        calibration = build_prompts(
            tokenizer, args.calibration_prompts, args.seed + 1, args.min_len, args.max_len
        )
        serve(reference, calibration, SamplingParams(temperature=0, max_tokens=1), "calibration", progress)
        scales = calibrate(reference)
    want = serve(reference, prompts, params, "model-dtype cache", progress)
    reference.close()
    del reference
    free_memory()
    with tempfile.TemporaryDirectory() as tmp:
        fp8_folder = with_scales(folder, scales, Path(tmp) / folder.name) if scales else folder
        fp8 = engine(fp8_folder, args, args.kv_cache_dtype)
        used = args.scales if scales else ("checkpoint" if fp8.core.executor.runner.kv_scales else "one")
        if args.kv_cache_dtype != "fp8_e4m3":
            used = "none"  # a 16-bit cache has no scales
        got = serve(fp8, prompts, params, f"{args.kv_cache_dtype} cache", progress)
        fp8.close()
        del fp8
        free_memory()
    metrics = compare(want, got, args.tokens)
    tag = device_tag(args.device)
    short = args.kv_cache_dtype.split("_")[0]  # fp8, bf16
    name = f"kv_{short}_accuracy_{args.model_tag or slug(folder.name)}_{tag}" + (
        "_calibrated" if args.scales == "calibrated" else ""
    )
    result = {
        "name": name,
        "stage": "final",
        "workload": "kv-fp8-accuracy",
        "label": f"{args.model_tag or folder.name}, {model_dtype} model, {short} cache, scales {used}",
        "metrics": metrics,
        "config": {
            "model": folder.name,
            "dtype": model_dtype,
            "kv_cache_dtype": args.kv_cache_dtype,
            "scales": used,
            "attn": attn,
            "device": tag,
            "prompts": args.prompts,
            "tokens": args.tokens,
            "min_len": args.min_len,
            "max_len": args.max_len,
            "seed": args.seed,
            "prompt_tokens": sum(map(len, prompts)),
            "corpus_sha256": hashlib.sha256(CORPUS.read_bytes()).hexdigest()[:16],
        },  # fmt: skip
        "hardware": describe(),
        "versions": versions(),
        "command": shlex.join(
            ["python", "-m", "scripts.kv_fp8_accuracy", *(argv if argv is not None else sys.argv[1:])]
        ),
        "timestamp": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    out = Path(args.out or ROOT / "benchmarks" / "results" / tag)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.json"
    path.write_text(json.dumps(stamp_run_id(result), indent=2) + "\n")
    summary = ", ".join(f"{k}={v:.4g}" for k, v in metrics.items())
    print(f"[kv-fp8] {name}: {summary} -> {path}", file=sys.stderr)
    return 0


def slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="model folder or hub id (default: the default model)")
    p.add_argument("--model-tag", default=None, help="the model's name in the result (default: its folder's)")
    p.add_argument("--device", default="cpu")
    p.add_argument(
        "--dtype", default="auto", help="the model's dtype (auto: float32 on the CPU, bf16 on a GPU)"
    )
    p.add_argument("--attn", default="auto")
    p.add_argument("--page-size", type=int, default=None)
    p.add_argument(
        "--kv-tokens", type=int, default=None, help="each engine's pool (default: 262144 on a GPU)"
    )
    p.add_argument("--max-running", type=int, default=256)
    p.add_argument("--prompts", type=int, default=200)
    p.add_argument("--tokens", type=int, default=64, help="greedy tokens per prompt")
    p.add_argument("--min-len", type=int, default=16)
    p.add_argument("--max-len", type=int, default=1024)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--scales", choices=("one", "calibrated"), default="one")
    p.add_argument(
        "--kv-cache-dtype", choices=("fp8_e4m3", "bf16"), default="fp8_e4m3", help="the cache measured"
    )
    p.add_argument("--calibration-prompts", type=int, default=32)
    p.add_argument("--threads", type=int, default=None, help="CPU threads for torch")
    p.add_argument("--out", type=Path, default=None, help="folder (default: benchmarks/results/<device>)")
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    if args.min_len < 1 or args.max_len < args.min_len or args.prompts < 1 or args.tokens < 1:
        p.error("need 1 <= --min-len <= --max-len, --prompts >= 1, --tokens >= 1")
    return args


if __name__ == "__main__":
    sys.exit(main())
