"""The Llama decoder as a ``tvm.relax.frontend.nn`` module over TVM's paged KV cache.

Functions the artifact exports (all batch shapes symbolic):

- ``batch_prefill(input_ids[n], logit_positions[b], kv) -> (logits[1, b, vocab], kv)``: the
  tokens of several sequences, concatenated; ``logit_positions`` picks the rows to project to the
  vocabulary (the last token of each sequence, or every token for scoring).
- ``batch_decode(input_ids[b], kv) -> (logits[b, 1, vocab], kv)``: one token per sequence.
- ``argmax_logits(logits[b, 1, vocab]) -> ids[b]`` (GPU artifacts only): greedy sampling on the device.
- ``create_paged_kv_cache(max_batch, max_total_len, prefill_chunk, page_size, sliding)``: the cache,
  allocated once by the runtime; sequences enter and leave it through ``vm.builtin.kv_state_*``.

Linear layers and the embedding table hold their weights in one of the schemes of
:mod:`inferx_edge.llm.quant`; each is dequantized inside the kernel that reads it (the matmul or the
gather is one TE expression with the dequantization inlined).
"""

from __future__ import annotations

from typing import Any

from tvm import tirx
from tvm.relax.frontend import nn
from tvm.relax.frontend.nn import Tensor, op
from tvm.relax.frontend.nn.llm.kv_cache import PagedKVCache, RopeMode, TIRPagedKVCache

from inferx_edge.llm.config import LlamaConfig
from inferx_edge.llm.quant import Scheme, WeightMatrix, embedding_scheme


def _is_gpu(target) -> bool:
    return getattr(getattr(target, "kind", None), "name", "") in ("cuda", "rocm", "vulkan", "metal")


class Linear(nn.Module):
    def __init__(self, out_features: int, in_features: int, scheme: Scheme, dtype: str, layout: str):
        self.weight = WeightMatrix(out_features, in_features, scheme, dtype, layout)

    def forward(self, x: Tensor, residual: Tensor | None = None) -> Tensor:
        return self.weight.matmul_nt(x, residual=residual)


class Attention(nn.Module):
    def __init__(self, cfg: LlamaConfig, scheme: Scheme, dtype: str, layout: str):
        self.nq, self.nkv, self.hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.qkv = Linear((self.nq + 2 * self.nkv) * self.hd, cfg.hidden_size, scheme, dtype, layout)
        self.o = Linear(cfg.hidden_size, self.nq * self.hd, scheme, dtype, layout)

    def forward(self, x: Tensor, kv: PagedKVCache, layer_id: int, residual: Tensor) -> Tensor:
        b, s, _ = x.shape
        qkv = op.reshape(self.qkv(x), (b, s, self.nq + 2 * self.nkv, self.hd))
        out = kv.attention_with_fused_qkv(layer_id, qkv, self.nq, sm_scale=self.hd**-0.5)
        return self.o(op.reshape(out, (b, s, self.nq * self.hd)), residual)


class MLP(nn.Module):
    def __init__(self, cfg: LlamaConfig, scheme: Scheme, dtype: str, layout: str):
        self.ffn = cfg.intermediate_size
        self.gate_up = Linear(2 * self.ffn, cfg.hidden_size, scheme, dtype, layout)
        self.down = Linear(cfg.hidden_size, self.ffn, scheme, dtype, layout)

    def forward(self, x: Tensor, residual: Tensor) -> Tensor:
        gate, up = op.split(self.gate_up(x), 2, axis=-1)
        return self.down(op.silu(gate) * up, residual)


class Block(nn.Module):
    def __init__(self, cfg: LlamaConfig, scheme: Scheme, dtype: str, layout: str):
        self.input_layernorm = nn.RMSNorm(cfg.hidden_size, -1, cfg.rms_norm_eps, bias=False, dtype=dtype)
        self.attn = Attention(cfg, scheme, dtype, layout)
        self.post_attention_layernorm = nn.RMSNorm(cfg.hidden_size, -1, cfg.rms_norm_eps, bias=False, dtype=dtype)
        self.mlp = MLP(cfg, scheme, dtype, layout)

    def forward(self, x: Tensor, kv: PagedKVCache, layer_id: int) -> Tensor:
        x = self.attn(self.input_layernorm(x), kv, layer_id, residual=x)  # x + attention
        return self.mlp(self.post_attention_layernorm(x), residual=x)


class LlamaForCausalLM(nn.Module):
    def __init__(
        self, cfg: LlamaConfig, scheme: Scheme, dtype: str, target: Any, layer_schemes=None, layout: str = "nt"
    ):
        self.cfg, self.dtype, self.target = cfg, dtype, target
        schemes = layer_schemes or [scheme] * cfg.num_hidden_layers
        emb = embedding_scheme(scheme)
        self.embed_tokens = WeightMatrix(cfg.vocab_size, cfg.hidden_size, emb, dtype, layout)
        self.layers = nn.ModuleList([Block(cfg, s, dtype, layout) for s in schemes])
        self.norm = nn.RMSNorm(cfg.hidden_size, -1, cfg.rms_norm_eps, bias=False, dtype=dtype)
        if not cfg.tie_word_embeddings:
            self.lm_head = WeightMatrix(cfg.vocab_size, cfg.hidden_size, emb, dtype, layout)
        if layout == "kn" and dtype == "float32":  # x86 CPUs: int4 matrices take the integer kernel
            from inferx_edge.llm.cpu_int_matmul import dot_lanes

            lanes = dot_lanes(target)
            for block in self.layers:
                for lin in (block.attn.qkv, block.attn.o, block.mlp.gate_up, block.mlp.down):
                    lin.weight.dot_lanes = lanes

    def _logits(self, h: Tensor) -> Tensor:
        table = self.embed_tokens if self.cfg.tie_word_embeddings else self.lm_head
        return table.matmul_nt(self.norm(h), out_dtype="float32")

    def _decoder(self, h: Tensor, kv: PagedKVCache) -> Tensor:
        for i, layer in enumerate(self.layers):
            h = layer(h, kv, i)
        return h

    def _embed(self, input_ids: Tensor) -> Tensor:
        return self.embed_tokens.take_rows(input_ids)

    def batch_prefill(self, input_ids: Tensor, logit_positions: Tensor, kv: PagedKVCache):
        h = op.unsqueeze(self._embed(input_ids), 0)
        h = op.take(self._decoder(h, kv), logit_positions, axis=1)
        return self._logits(h), kv

    def batch_decode(self, input_ids: Tensor, kv: PagedKVCache):
        h = op.unsqueeze(self._embed(input_ids), 1)
        return self._logits(self._decoder(h, kv)), kv

    def argmax_logits(self, logits: Tensor) -> Tensor:
        """Each sequence's most likely next token from ``batch_decode``'s logits, on the device (GPU
        artifacts: greedy decoding copies ids, not logits, to the host)."""
        from inferx_edge.llm.gpu_sampling import argmax_rows

        out = Tensor.placeholder((logits.shape[0],), "int32")
        return op.tensor_ir_op(argmax_rows(self.cfg.vocab_size), "argmax_rows", [logits], out)

    def create_paged_kv_cache(
        self,
        max_batch_size: tirx.Var,
        max_total_seq_len: tirx.Var,
        prefill_chunk_size: tirx.Var,
        page_size: tirx.Var,
        support_sliding_window: tirx.Var,
    ) -> PagedKVCache:
        from tvm import relax as rx

        cfg = self.cfg
        return TIRPagedKVCache(
            attn_kind="mha",
            max_batch_size=max_batch_size,
            max_total_seq_len=max_total_seq_len,
            prefill_chunk_size=prefill_chunk_size,
            page_size=page_size,
            support_sliding_window=support_sliding_window,
            layer_partition=rx.ShapeExpr([0, cfg.num_hidden_layers]),
            num_hidden_layers=cfg.num_hidden_layers,
            num_attention_heads=cfg.num_attention_heads,
            num_key_value_heads=cfg.num_key_value_heads,
            qk_head_dim=cfg.head_dim,
            v_head_dim=cfg.head_dim,
            mla_original_qk_head_dim=0,
            mla_original_v_head_dim=0,
            rope_mode=RopeMode.NORMAL,
            rope_scale=1,
            rope_theta=cfg.rope_theta,
            rope_scaling={},
            rope_ext_factors=rx.prim_value(False),
            rotary_dim=cfg.head_dim,
            enable_disaggregation=False,
            dtype=self.dtype,
            target=self.target,
        )

    def get_default_spec(self) -> dict[str, Any]:
        packed = {"param_mode": "packed", "effect_mode": "none"}
        plain = {"param_mode": "none", "effect_mode": "none"}
        kv = nn.spec.Object(object_type=PagedKVCache)
        return {
            "batch_prefill": {
                "input_ids": nn.spec.Tensor(["seq_len"], "int32"),
                "logit_positions": nn.spec.Tensor(["batch_size"], "int32"),
                "kv": kv,
                "$": packed,
            },
            "batch_decode": {"input_ids": nn.spec.Tensor(["batch_size"], "int32"), "kv": kv, "$": packed},
            **(
                {
                    "argmax_logits": {
                        "logits": nn.spec.Tensor(["batch_size", 1, self.cfg.vocab_size], "float32"),
                        "$": plain,
                    }
                }
                if _is_gpu(self.target)
                else {}
            ),
            "create_paged_kv_cache": {
                "max_batch_size": int,
                "max_total_seq_len": int,
                "prefill_chunk_size": int,
                "page_size": int,
                "support_sliding_window": int,
                "$": {"param_mode": "none", "effect_mode": "none"},
            },
        }
