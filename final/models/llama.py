"""A Llama-family decoder: Llama 2/3, Mistral, SmolLM2, Qwen2 (q/k/v bias), Qwen3 (q/k norm).

Module names follow Hugging Face's except where we merge: `qkv_proj` holds q_proj, k_proj and
v_proj, `gate_up_proj` holds gate_proj and up_proj (see PACKED_MODULES and models/weights.py).
Under tensor parallelism each rank holds a slice of the heads and of the MLP (models/layers.py);
the shapes below are this rank's.
"""

from __future__ import annotations

import torch
from torch import nn

from ..core.forward_batch import Attention, ForwardBatch
from ..core.model_config import ModelConfig
from ..distributed.tp import TPInfo
from ..kernels import qk_norm_rope_kv
from .layers import (
    MergedColumnLinear,
    ParallelLMHead,
    RMSNorm,
    RowParallelLinear,
    VocabParallelEmbedding,
    silu_and_mul,
)
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
    def __init__(self, config: ModelConfig, layer: int, tp: TPInfo):
        super().__init__()
        self.layer = layer
        self.head_dim = config.head_dim
        self.num_heads = tp.split(config.num_heads, "attention heads")
        first_kv, self.num_kv_heads = tp.kv_head_shard(config.num_kv_heads)
        self.q_size, self.kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        q_shard = tp.shard(config.num_heads * self.head_dim)
        kv_shard = (first_kv * self.head_dim, self.kv_size)
        self.qkv_proj = MergedColumnLinear(config.hidden_size, [q_shard, kv_shard, kv_shard], config.qkv_bias)
        self.o_proj = RowParallelLinear(
            config.num_heads * self.head_dim, config.hidden_size, config.o_bias, tp
        )
        self.qk_norm = config.qk_norm
        if config.qk_norm:  # Qwen3 normalises each head's query and key before RoPE
            self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
            self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps)

    def project(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        rope: RotaryEmbedding,
        attn: Attention,
        out_slots: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """Attention's inputs (q, k, v) from the normed hidden states; k and v None where one kernel
        has already written them into the pool (the backend then only attends)."""
        tokens = x.shape[0]  # the new tokens of every request in the batch, concatenated
        qkv = self.qkv_proj(x)
        if qk_norm_rope_kv.available(qkv):
            # One kernel: the q/k norm, RoPE, and k and v written into the pool at out_slots.
            cache = attn.layer_kv(self.layer)
            weights = (self.q_norm.weight, self.k_norm.weight) if self.qk_norm else (None, None)
            eps = self.q_norm.eps if self.qk_norm else 0.0
            q = qk_norm_rope_kv.qk_norm_rope_kv(
                qkv, self.num_heads, self.num_kv_heads, positions, rope.cos_sin, cache.k, cache.v,
                out_slots, *weights, eps, cache.k_scale, cache.v_scale,
            )  # fmt: skip
            return q, None, None
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(tokens, self.num_heads, self.head_dim)
        k = k.view(tokens, self.num_kv_heads, self.head_dim)
        v = v.view(tokens, self.num_kv_heads, self.head_dim)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = rope(q, k, positions)
        return q, k, v  # the backend writes k and v into the request's pages, then attends

    def forward(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        rope: RotaryEmbedding,
        attn: Attention,
        batch: ForwardBatch,
    ) -> torch.Tensor:
        q, k, v = self.project(x, positions, rope, attn, batch.out_slots)
        return self.o_proj(attn.forward(self.layer, q, k, v, batch))


class GatedMLP(nn.Module):
    def __init__(self, config: ModelConfig, tp: TPInfo):
        super().__init__()
        hidden, inner, bias = config.hidden_size, config.intermediate_size, config.mlp_bias
        self.gate_up_proj = MergedColumnLinear.split_evenly(hidden, [inner, inner], bias, tp)
        self.down_proj = RowParallelLinear(inner, hidden, bias, tp)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(silu_and_mul(self.gate_up_proj(x)))


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer: int, tp: TPInfo):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = SelfAttention(config, layer, tp)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = GatedMLP(config, tp)

    def forward(self, x, residual, positions, rope, attn, batch):
        """(this layer's output, the residual stream before it is added): the add happens fused
        into the next norm, the next layer's or the final one."""
        q, k, v, residual = self.before_attention(x, residual, positions, rope, attn, batch.out_slots)
        return self.after_attention(attn.forward(self.self_attn.layer, q, k, v, batch), residual)

    # The layer in two halves around attention: what the prefill graphs (engine/prefill_graph.py)
    # capture, attention itself staying eager.
    def before_attention(self, x, residual, positions, rope, attn, out_slots):
        """(q, k, v, residual): the residual add and norm, then attention's inputs (SelfAttention.project)."""
        if residual is None:
            residual, h = x, self.input_layernorm(x)
        else:
            h, residual = self.input_layernorm.add_and_norm(x, residual)
        return (*self.self_attn.project(h, positions, rope, attn, out_slots), residual)

    def after_attention(self, o: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(the layer's output, the residual stream) from attention's output."""
        h, residual = self.post_attention_layernorm.add_and_norm(self.self_attn.o_proj(o), residual)
        return self.mlp(h), residual


class DecoderStack(nn.Module):
    def __init__(self, config: ModelConfig, tp: TPInfo):
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size, tp)
        self.layers = nn.ModuleList(DecoderLayer(config, i, tp) for i in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class LlamaForCausalLM(nn.Module):
    """forward(batch) -> logits [batch size, vocab] of each request's last token only, in the
    model's dtype (the sampler reads bf16 as it is: no float32 copy of a [batch, 152k] tensor)."""

    packed_modules = PACKED_MODULES

    def __init__(self, config: ModelConfig, tp: TPInfo | None = None):
        super().__init__()
        tp = tp or TPInfo()
        self.config = config
        self.model = DecoderStack(config, tp)
        self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size, tp)
        self.rope: RotaryEmbedding | None = None  # built on the right device after loading

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch, attn: Attention, out: torch.Tensor | None = None) -> torch.Tensor:
        """The logits of each sampled request's last token [S, vocab]; into `out` where given (a
        decode graph's static logits buffer)."""
        assert self.rope is not None, "load the model with models.load_model"
        x, residual = self.model.embed_tokens(batch.input_ids), None
        for layer in self.model.layers:
            x, residual = layer(x, residual, batch.positions, self.rope, attn, batch)
            if batch.between_layers is not None:
                batch.between_layers()  # host work while the GPU runs what is queued (delivery.py)
        # The LM head is the largest matmul of a step; a prefill of T tokens needs only B rows of it.
        last = batch.last_token_index
        if last is not None:  # None: each token is a request's last (a decode graph), no gather
            x, residual = x[last], residual[last]
        x, _ = self.model.norm.add_and_norm(x, residual)
        return self.lm_head(x, out=out)
