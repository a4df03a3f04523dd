"""Write a random-weight HF checkpoint: Qwen3-0.6B's (or 8B's, 14B's) exact shapes, or a tiny test model.

    python -m scripts.make_random_checkpoint --shape qwen3-0.6b --out checkpoints/qwen3-0.6b-random
    python -m scripts.make_random_checkpoint --shape qwen3-8b --out checkpoints/qwen3-8b-random
    python -m scripts.make_random_checkpoint --shape tiny-qwen3 --out /tmp/tiny-qwen3

The benchmarks use the Qwen3-0.6B shape so results compare with published Qwen3-0.6B figures;
speed depends on shapes, not on what the weights learned. The 8B (16 GB in bf16) and 14B (30 GB)
shapes are for tensor parallelism, where a model must be large enough for sharding to pay. No
hub access is needed.

The large checkpoint is written without ever holding the model in memory: transformers builds
it on the meta device (names and shapes only), and each tensor is generated in chunks and
streamed straight into a single safetensors file.
"""

from __future__ import annotations

import argparse
import json
import shutil
import struct
import time
from pathlib import Path

import torch
from tqdm import tqdm
from transformers import AutoModelForCausalLM, GenerationConfig, PretrainedConfig, Qwen3Config

from tests.fixtures.tiny_models import (
    ENDOFTEXT,
    IM_END,
    make_tiny_checkpoint,
    train_tiny_tokenizer,
)

QWEN3_VOCAB = 151936
# The fields in which the Qwen3 sizes differ, from their config.json files on the hub.
QWEN3_SHAPES: dict[str, dict[str, int | bool]] = {
    "qwen3-0.6b": dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                       num_attention_heads=16, num_key_value_heads=8, tie_word_embeddings=True),
    "qwen3-8b": dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
                     num_attention_heads=32, num_key_value_heads=8, tie_word_embeddings=False),
    "qwen3-14b": dict(hidden_size=5120, intermediate_size=17408, num_hidden_layers=40,
                      num_attention_heads=40, num_key_value_heads=8, tie_word_embeddings=False),
}  # fmt: skip
# safetensors' dtype names.
SAFETENSORS_DTYPES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16"}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
CHUNK_ELEMENTS = 1 << 24  # 64 MB of fp32 noise at a time bounds peak memory
WEIGHT_STD = 0.02  # HF's initializer_range for Qwen3


def qwen3_config(shape: str, dtype: torch.dtype, eos_token_id: int, pad_token_id: int) -> Qwen3Config:
    """The config.json of a Qwen3 size, field for field, except the special-token ids.

    The ids are our tokenizer's (eos `<|im_end|>`), so the folder is self-consistent; benchmarks
    ignore EOS anyway.
    """
    sizes = QWEN3_SHAPES[shape]
    return Qwen3Config(
        vocab_size=QWEN3_VOCAB,
        **sizes,
        head_dim=128,
        hidden_act="silu",
        max_position_embeddings=40960,
        # transformers 5 keeps rope_theta inside rope_parameters (config.json has no rope_theta).
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        rms_norm_eps=1e-6,
        attention_bias=False,
        attention_dropout=0.0,
        use_sliding_window=False,
        sliding_window=None,
        max_window_layers=sizes["num_hidden_layers"],
        initializer_range=WEIGHT_STD,
        use_cache=True,
        bos_token_id=None,
        eos_token_id=eos_token_id,
        pad_token_id=pad_token_id,
        dtype=dtype,
        architectures=["Qwen3ForCausalLM"],
    )


def parameter_shapes(config: PretrainedConfig) -> dict[str, tuple[int, ...]]:
    """Checkpoint tensor names and shapes, from a model built on the meta device (no memory)."""
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    # named_parameters() lists a tied lm_head once (as the embedding); real tied checkpoints
    # store no lm_head.weight, and neither do we. Buffers (rotary inv_freq) are not saved.
    shapes = {name: tuple(param.shape) for name, param in model.named_parameters()}
    if config.tie_word_embeddings:
        shapes.pop("lm_head.weight", None)
    return shapes


def write_random_safetensors(
    path: Path, shapes: dict[str, tuple[int, ...]], dtype: torch.dtype, seed: int
) -> None:
    """Stream random tensors into one safetensors file: N(0, 0.02) weights, norms exactly 1.

    The format is an 8-byte little-endian header length, a JSON header of name -> dtype, shape,
    byte offsets, then the raw tensors back to back; so the header can be written first and
    the data appended tensor by tensor.
    """
    itemsize = torch.empty((), dtype=dtype).element_size()
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, shape in shapes.items():
        nbytes = itemsize * int(torch.Size(shape).numel())
        header[name] = {
            "dtype": SAFETENSORS_DTYPES[dtype],
            "shape": list(shape),
            "data_offsets": [offset, offset + nbytes],
        }
        offset += nbytes
    header_bytes = json.dumps(header, separators=(",", ":")).encode()
    header_bytes += b" " * (-len(header_bytes) % 8)  # the data starts 8-byte aligned

    generator = torch.Generator().manual_seed(seed)
    with open(path, "wb") as file, tqdm(total=offset, unit="B", unit_scale=True, desc=path.name) as progress:
        file.write(struct.pack("<Q", len(header_bytes)))
        file.write(header_bytes)
        for name, shape in shapes.items():
            if "norm" in name:  # input/post-attention/final RMSNorm, q_norm, k_norm
                tensor = torch.ones(shape, dtype=dtype)
                file.write(tensor.view(torch.uint8).numpy().tobytes())
                progress.update(tensor.numel() * itemsize)
                continue
            row_elements = int(torch.Size(shape[1:]).numel())
            rows_per_chunk = max(1, CHUNK_ELEMENTS // row_elements)
            for start in range(0, shape[0], rows_per_chunk):
                rows = min(rows_per_chunk, shape[0] - start)
                chunk = torch.randn((rows, *shape[1:]), generator=generator) * WEIGHT_STD
                file.write(chunk.to(dtype).view(torch.uint8).numpy().tobytes())
                progress.update(chunk.numel() * itemsize)


def make_qwen3(shape: str, out_dir: Path, dtype: torch.dtype, seed: int) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    # The tiny BPE tokenizer, padded with reserved tokens to the embedding size: a random
    # model emits any id in [0, 151936), and each must decode.
    train_tiny_tokenizer(out_dir, pad_vocab_to=QWEN3_VOCAB)
    vocab = json.loads((out_dir / "tokenizer.json").read_text())["model"]["vocab"]
    eos_id, pad_id = vocab[IM_END], vocab[ENDOFTEXT]

    config = qwen3_config(shape, dtype, eos_token_id=eos_id, pad_token_id=pad_id)
    shapes = parameter_shapes(config)
    n_params = sum(int(torch.Size(s).numel()) for s in shapes.values())
    print(f"{len(shapes)} tensors, {n_params / 1e6:.1f}M parameters, {dtype}")
    write_random_safetensors(out_dir / "model.safetensors", shapes, dtype, seed)
    # The config last: a folder with a config.json is a whole checkpoint (gpu_run.sh's `ckpt` steps
    # skip one that has it), so a run cut off while writing the weights leaves no config behind.
    config.save_pretrained(out_dir)
    GenerationConfig(bos_token_id=None, eos_token_id=eos_id, pad_token_id=pad_id).save_pretrained(out_dir)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--shape", required=True, choices=[*QWEN3_SHAPES, "tiny-qwen3", "tiny-llama"])
    parser.add_argument("--out", required=True, type=Path, help="output folder (HF layout)")
    parser.add_argument(
        "--dtype",
        choices=sorted(DTYPES),
        default=None,
        help="weight dtype (default: bfloat16 for the Qwen3 sizes; tiny shapes are float32)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--force", action="store_true", help="overwrite a non-empty --out")
    args = parser.parse_args(argv)

    out: Path = args.out
    if out.exists() and any(out.iterdir()):
        if not args.force:
            parser.error(f"{out} is not empty; pass --force to overwrite it")
        shutil.rmtree(out)

    started = time.perf_counter()
    if args.shape in QWEN3_SHAPES:
        make_qwen3(args.shape, out, DTYPES[args.dtype or "bfloat16"], args.seed)
    else:
        if args.dtype not in (None, "float32"):
            parser.error("tiny shapes are float32 only (they are the fp32 test oracle's models)")
        make_tiny_checkpoint(out, args.shape.removeprefix("tiny-"), seed=args.seed)
    print(f"wrote {out} in {time.perf_counter() - started:.1f} s")


if __name__ == "__main__":
    main()
