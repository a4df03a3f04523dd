"""A Llama-family decoder: Llama 2/3, Mistral, SmolLM2, Qwen2 (q/k/v bias), Qwen3 (q/k norm).

Module names follow Hugging Face's except where we merge: `qkv_proj` holds q_proj, k_proj and
v_proj, `gate_up_proj` holds gate_proj and up_proj (see PACKED_MODULES and models/weights.py).
"""

from __future__ import annotations

import torch
from torch import nn

from ..core.forward_batch import Attention, ForwardBatch
from ..core.model_config import ModelConfig
from .layers import Linear, MergedLinear, RMSNorm, silu_and_mul
from .rope import RotaryEmbedding

# Checkpoint module name -> (our merged module, which part of it).
PACKED_MODULES: dict[str, tuple[str, int]] = {
    "q_proj": ("qkv_proj", 0),
    "k_proj": ("qkv_proj", 1),
    "v_proj": ("qkv_proj", 2),
    "gate_proj": ("gate_up_proj", 0),
    "up_proj": ("gate_up_proj", 1),
}


class SelfAttention(nn.Module):
    def __init__(self, config: ModelConfig, layer: int):
        super().__init__()
        self.layer = layer
        self.num_heads, self.num_kv_heads, self.head_dim = (
            config.num_heads,
            config.num_kv_heads,
            config.head_dim,
        )
        self.q_size, self.kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.qkv_proj = MergedLinear(
            config.hidden_size, [self.q_size, self.kv_size, self.kv_size], config.qkv_bias
        )
        self.o_proj = Linear(self.q_size, config.hidden_size, bias=config.o_bias)
        self.qk_norm = config.qk_norm
        if config.qk_norm:  # Qwen3 normalises each head's query and key before RoPE
            self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
            self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps)

    def forward(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        rope: RotaryEmbedding,
        attn: Attention,
        batch: ForwardBatch,
    ) -> torch.Tensor:
        tokens = x.shape[0]  # the new tokens of every request in the batch, concatenated
        q, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(tokens, self.num_heads, self.head_dim)
        k = k.view(tokens, self.num_kv_heads, self.head_dim)
        v = v.view(tokens, self.num_kv_heads, self.head_dim)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = rope(q, positions), rope(k, positions)
        # The backend writes k and v into the request's pages and attends over all its pages.
        return self.o_proj(attn.forward(self.layer, q, k, v, batch))


class GatedMLP(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        hidden, inner, bias = config.hidden_size, config.intermediate_size, config.mlp_bias
        self.gate_up_proj = MergedLinear(hidden, [inner, inner], bias)
        self.down_proj = Linear(inner, hidden, bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(silu_and_mul(self.gate_up_proj(x)))


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer: int):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = SelfAttention(config, layer)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = GatedMLP(config)

    def forward(self, x, positions, rope, attn, batch):
        x = x + self.self_attn(self.input_layernorm(x), positions, rope, attn, batch)
        return x + self.mlp(self.post_attention_layernorm(x))


class DecoderStack(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.embed_tokens.weight.requires_grad_(False)
        self.layers = nn.ModuleList(DecoderLayer(config, i) for i in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class LlamaForCausalLM(nn.Module):
    """forward(batch) -> logits [batch size, vocab] of each request's last token only."""

    packed_modules = PACKED_MODULES

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.model = DecoderStack(config)
        self.lm_head = Linear(config.hidden_size, config.vocab_size, bias=False)
        self.rope: RotaryEmbedding | None = None  # built on the right device after loading

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch, attn: Attention) -> torch.Tensor:
        assert self.rope is not None, "load the model with models.load_model"
        x = self.model.embed_tokens(batch.input_ids)
        for layer in self.model.layers:
            x = layer(x, batch.positions, self.rope, attn, batch)
        # The LM head is the largest matmul of a step; a prefill of T tokens needs only B rows of it.
        x = self.model.norm(x[batch.last_token_index])
        return self.lm_head(x).float()
