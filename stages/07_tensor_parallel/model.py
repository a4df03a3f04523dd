"""A Llama-family decoder in plain PyTorch: Llama 2/3, Mistral, Qwen2 (q/k/v bias), Qwen3 (q/k norm),
SmolLM2. Module names match Hugging Face's, so a checkpoint loads by name.

Under tensor parallelism each rank builds the same modules with its own slices (layers.py): a share
of the attention heads and of the MLP, a share of the vocabulary. The shapes below are this rank's;
`load_model` reads only them from the checkpoint."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors import safe_open
from torch import nn

from stages.common.errors import UserError
from stages.common.model_config import ModelConfig
from stages.common.weights import STRIP_PREFIXES, checkpoint_files

from .attention import AttentionBackend
from .distributed import TPInfo
from .layers import ColumnParallelLinear, ParallelLMHead, RowParallelLinear, VocabParallelEmbedding
from .request import Batch
from .rope import RotaryEmbedding


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in float32 even for bf16 activations: the mean of squares loses too much in bf16.
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


# --8<-- [start:sharded_attention]
class Attention(nn.Module):
    def __init__(self, config: ModelConfig, layer: int, tp: TPInfo):
        super().__init__()
        self.layer, self.head_dim = layer, config.head_dim
        # This rank's query heads, and the KV heads they read (replicated when fewer than the ranks).
        self.num_heads = tp.split(config.num_heads, "attention heads")
        first_kv, self.num_kv_heads = tp.kv_head_shard(config.num_kv_heads)
        hidden, hd, bias = config.hidden_size, config.head_dim, config.qkv_bias
        kv_rows = (first_kv * hd, self.num_kv_heads * hd)
        self.q_proj = ColumnParallelLinear(hidden, config.num_heads * hd, bias, tp)
        self.k_proj = ColumnParallelLinear(hidden, config.num_kv_heads * hd, bias, tp, rows=kv_rows)
        self.v_proj = ColumnParallelLinear(hidden, config.num_kv_heads * hd, bias, tp, rows=kv_rows)
        self.o_proj = RowParallelLinear(config.num_heads * hd, hidden, config.o_bias, tp)  # one all-reduce
        if config.qk_norm:  # Qwen3 normalises each head's query and key before RoPE
            self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
            self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
        self.qk_norm = config.qk_norm

    # --8<-- [end:sharded_attention]

    # --8<-- [start:attention]
    def forward(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        rope: RotaryEmbedding,
        backend: AttentionBackend,
        batch: Batch,
    ) -> torch.Tensor:
        tokens = x.shape[0]  # the new tokens of every request in the batch, concatenated
        q = self.q_proj(x).view(tokens, self.num_heads, self.head_dim)
        k = self.k_proj(x).view(tokens, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x).view(tokens, self.num_kv_heads, self.head_dim)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = rope(q, positions), rope(k, positions)
        # The backend writes k and v into the request's pages and attends over all its pages.
        return self.o_proj(backend.forward(self.layer, q, k, v, batch))

    # --8<-- [end:attention]


# --8<-- [start:sharded_mlp]
class MLP(nn.Module):
    def __init__(self, config: ModelConfig, tp: TPInfo):
        super().__init__()
        hidden, inner, bias = config.hidden_size, config.intermediate_size, config.mlp_bias
        self.gate_proj = ColumnParallelLinear(hidden, inner, bias, tp)
        self.up_proj = ColumnParallelLinear(hidden, inner, bias, tp)
        self.down_proj = RowParallelLinear(inner, hidden, bias, tp)  # one all-reduce

    # --8<-- [end:sharded_mlp]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer: int, tp: TPInfo):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config, layer, tp)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config, tp)

    def forward(self, x, positions, rope, backend, batch):
        x = x + self.self_attn(self.input_layernorm(x), positions, rope, backend, batch)
        return x + self.mlp(self.post_attention_layernorm(x))


class DecoderStack(nn.Module):
    def __init__(self, config: ModelConfig, tp: TPInfo):
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size, tp)
        self.layers = nn.ModuleList(DecoderLayer(config, i, tp) for i in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)  # replicated, as the other norms


class CausalLM(nn.Module):
    """forward(a batch's new tokens, their positions, ...) -> logits of each request's last token,
    the whole vocabulary on every rank."""

    def __init__(self, config: ModelConfig, tp: TPInfo):
        super().__init__()
        self.config = config
        self.model = DecoderStack(config, tp)
        self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size, tp)
        self.rope: RotaryEmbedding | None = None  # built on the right device after loading

    # --8<-- [start:forward]
    @torch.inference_mode()
    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, backend: AttentionBackend, batch: Batch
    ) -> torch.Tensor:
        x = self.model.embed_tokens(input_ids)
        for layer in self.model.layers:
            x = layer(x, positions, self.rope, backend, batch)
        x = self.model.norm(x[batch.last_token_index])  # one row per request picks its next token
        return self.lm_head(x).float()

    # --8<-- [end:forward]


# --8<-- [start:load]
def load_model(
    folder: Path,
    config: ModelConfig,
    device: torch.device | str,
    dtype: torch.dtype,
    tp: TPInfo | None = None,
) -> CausalLM:
    with torch.device("meta"):  # no memory, no random init: the checkpoint fills every weight
        model = CausalLM(config, tp or TPInfo())
    load_shards(model, folder, device, dtype)
    if config.tie_word_embeddings and model.lm_head.weight.is_meta:  # tied: the same slice of the same rows
        model.lm_head.weight = model.model.embed_tokens.weight
    missing = [name for name, p in model.named_parameters() if p.is_meta]
    if missing:
        raise UserError(f"checkpoint {folder} lacks {len(missing)} weights, e.g. {missing[:3]}")
    model.rope = RotaryEmbedding(config, device, dtype)
    return model.eval()


def load_shards(model: CausalLM, folder: Path, device: torch.device | str, dtype: torch.dtype) -> None:
    """Fill the model's parameters from the checkpoint, reading only this rank's slice of each: a
    sharded layer says which (`read_shard`); anything else (a norm) is read whole."""
    params = dict(model.named_parameters())
    for file in checkpoint_files(folder):
        with safe_open(str(file), framework="pt") as reader:
            for key in reader.keys():
                name = next((key.removeprefix(p) for p in STRIP_PREFIXES if key.startswith(p)), key)
                if name not in params:
                    continue  # e.g. rotary inv_freq buffers that old checkpoints carry
                module_name, _, attr = name.rpartition(".")
                module = model.get_submodule(module_name)
                tensor = reader.get_slice(key)  # nothing read yet
                shard = module.read_shard(attr, tensor) if hasattr(module, "read_shard") else tensor[:]
                if shard.shape != params[name].shape:
                    raise UserError(f"weight {name} has shape {tuple(shard.shape)} in the checkpoint "
                                    f"(this rank's slice), the model expects {tuple(params[name].shape)}")  # fmt: skip
                setattr(module, attr, nn.Parameter(shard.to(device=device, dtype=dtype), requires_grad=False))


# --8<-- [end:load]
