"""A Llama-family decoder in plain PyTorch: Llama 2/3, Mistral, Qwen2 (q/k/v bias), Qwen3 (q/k norm),
SmolLM2. Module names match Hugging Face's, so a checkpoint loads by name."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from stages.common.model_config import ModelConfig
from stages.common.weights import load_weights

from .attention import AttentionBackend
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


class Attention(nn.Module):
    def __init__(self, config: ModelConfig, layer: int):
        super().__init__()
        self.layer = layer
        self.num_heads, self.num_kv_heads, self.head_dim = (
            config.num_heads,
            config.num_kv_heads,
            config.head_dim,
        )
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.q_proj = nn.Linear(config.hidden_size, q_size, bias=config.qkv_bias)
        self.k_proj = nn.Linear(config.hidden_size, kv_size, bias=config.qkv_bias)
        self.v_proj = nn.Linear(config.hidden_size, kv_size, bias=config.qkv_bias)
        self.o_proj = nn.Linear(q_size, config.hidden_size, bias=config.o_bias)
        if config.qk_norm:  # Qwen3 normalises each head's query and key before RoPE
            self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
            self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
        self.qk_norm = config.qk_norm

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


class MLP(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        hidden, inner, bias = config.hidden_size, config.intermediate_size, config.mlp_bias
        self.gate_proj = nn.Linear(hidden, inner, bias=bias)
        self.up_proj = nn.Linear(hidden, inner, bias=bias)
        self.down_proj = nn.Linear(inner, hidden, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer: int):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config, layer)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config)

    def forward(self, x, positions, rope, backend, batch):
        x = x + self.self_attn(self.input_layernorm(x), positions, rope, backend, batch)
        return x + self.mlp(self.post_attention_layernorm(x))


class DecoderStack(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, i) for i in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class CausalLM(nn.Module):
    """forward(a batch's new tokens, their positions, ...) -> logits of each request's last token."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.model = DecoderStack(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
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


def load_model(folder: Path, config: ModelConfig, device: torch.device | str, dtype: torch.dtype) -> CausalLM:
    with torch.device("meta"):  # no memory, no random init: the checkpoint fills every weight
        model = CausalLM(config)
    load_weights(model, folder, device, dtype, tie_word_embeddings=config.tie_word_embeddings)
    model.rope = RotaryEmbedding(config, device, dtype)
    return model.eval()
