"""Per-layer quantization sensitivity of an LLM and a mixed precision under a perplexity budget.

The same idea as the CNN path (:mod:`inferx_edge.quantize`): measure what quantizing each layer alone
costs, then keep the most sensitive layers in a wider precision until the whole model meets the
budget, re-measured. Measured with a float32 numpy forward of the checkpoint on calibration text
(the weights dequantized back from each scheme), so no device and no compiled artifact are needed.
"""

from __future__ import annotations

import math

import numpy as np

from inferx_edge.errors import BudgetError, UsageError
from inferx_edge.llm.checkpoint import Checkpoint
from inferx_edge.llm.quant import dequantize, effective_kind, embedding_scheme, get_scheme, quantize

_MATRICES = ("q", "k", "v", "o", "gate", "up", "down")


def _rms(x, w, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def _rope(x, pos, theta):  # x [H, S, D]
    d = x.shape[-1]
    inv = 1.0 / theta ** (np.arange(0, d, 2, dtype=np.float64) / d)
    ang = np.outer(pos, inv)
    cos, sin = np.cos(np.concatenate([ang, ang], -1)), np.sin(np.concatenate([ang, ang], -1))
    half = d // 2
    rot = np.concatenate([-x[..., half:], x[..., :half]], -1)
    return (x * cos + rot * sin).astype(np.float32)


def nll(ck: Checkpoint, weights: dict[str, np.ndarray], ids: list[int]) -> float:
    """Summed negative log-likelihood of ``ids[1:]`` under ``weights`` (float32 numpy forward)."""
    cfg = ck.config
    nq, nkv, hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    n = len(ids)
    x = weights["embed_tokens"][np.asarray(ids)]
    pos = np.arange(n)
    causal = np.triu(np.full((n, n), -np.inf, dtype=np.float32), 1)
    for i in range(cfg.num_hidden_layers):
        w = lambda name: weights[f"layers.{i}.{name}"]  # noqa: E731, B023
        h = _rms(x, w("input_layernorm"), cfg.rms_norm_eps)
        q = _rope((h @ w("q").T).reshape(n, nq, hd).transpose(1, 0, 2), pos, cfg.rope_theta)
        k = _rope((h @ w("k").T).reshape(n, nkv, hd).transpose(1, 0, 2), pos, cfg.rope_theta)
        v = (h @ w("v").T).reshape(n, nkv, hd).transpose(1, 0, 2)
        rep = nq // nkv
        k, v = np.repeat(k, rep, axis=0), np.repeat(v, rep, axis=0)
        s = q @ k.transpose(0, 2, 1) / math.sqrt(hd) + causal
        s = np.exp(s - s.max(-1, keepdims=True))
        a = (s / s.sum(-1, keepdims=True)) @ v
        x = x + a.transpose(1, 0, 2).reshape(n, nq * hd) @ w("o").T
        h = _rms(x, w("post_attention_layernorm"), cfg.rms_norm_eps)
        g, u = h @ w("gate").T, h @ w("up").T
        x = x + (g / (1 + np.exp(-g)) * u) @ w("down").T
    head = weights["embed_tokens" if cfg.tie_word_embeddings else "lm_head"]
    logits = (_rms(x, weights["norm"], cfg.rms_norm_eps) @ head.T).astype(np.float64)[:-1]
    m = logits.max(-1, keepdims=True)
    logz = np.log(np.exp(logits - m).sum(-1)) + m[:, 0]
    return float((logz - logits[np.arange(n - 1), ids[1:]]).sum())


def _quantized(w: np.ndarray, precision: str) -> np.ndarray:
    kind = effective_kind(get_scheme(precision), w.shape[1], w.shape[0])
    return dequantize(quantize(w, kind, "float32"), kind)


def layer_sensitivity(ck: Checkpoint, precision: str, ids: list[int], progress=None) -> dict:
    """Perplexity with every weight float32, with all layers in ``precision``, and with each layer
    alone in ``precision`` (rows sorted most sensitive first)."""
    if len(ids) < 16:
        raise UsageError(f"the calibration text has {len(ids)} tokens; at least 16 are needed")
    base = dict(ck.weights)
    ppl = lambda w: math.exp(nll(ck, w, ids) / (len(ids) - 1))  # noqa: E731
    fp32 = ppl(base)
    per_layer = {}
    for i in range(ck.config.num_hidden_layers):
        per_layer[i] = {f"layers.{i}.{m}": _quantized(base[f"layers.{i}.{m}"], precision) for m in _MATRICES}
    rows = []
    for i, q in per_layer.items():
        p = ppl(base | q)
        rows.append({"layer": i, "perplexity": round(p, 4), "increase_pct": round((p / fp32 - 1) * 100, 3)})
        if progress:
            progress(f"      layer {i:2d} alone in {precision}: perplexity {p:.3f} (+{(p / fp32 - 1) * 100:.2f} %)")
    rows.sort(key=lambda r: -r["increase_pct"])
    return {"precision": precision, "fp32_perplexity": round(fp32, 4), "tokens": len(ids), "layers": rows,
            "_quantized": per_layer}  # fmt: skip


def choose_layer_precisions(
    ck: Checkpoint, table: dict, ids: list[int], budget_pct: float, fallback: str = "int8", progress=None
) -> tuple[dict[int, str], dict]:
    """Layers kept in ``fallback`` (most sensitive first) until the model is within ``budget_pct``
    per cent of the fp32 perplexity, re-measured at each step. Raises :class:`BudgetError` when even
    every layer in ``fallback`` misses it."""
    base = dict(ck.weights)
    fp32 = table["fp32_perplexity"]
    emb_kind = effective_kind(
        embedding_scheme(get_scheme(table["precision"])), ck.config.hidden_size, ck.config.vocab_size
    )
    emb = {"embed_tokens": dequantize(quantize(base["embed_tokens"], emb_kind, "float32"), emb_kind)}
    fb = {i: {f"layers.{i}.{m}": _quantized(base[f"layers.{i}.{m}"], fallback) for m in _MATRICES} for i in table["_quantized"]}  # fmt: skip
    order = [r["layer"] for r in table["layers"]]
    chosen: dict[int, str] = {}
    steps = []
    for n_keep in range(len(order) + 1):
        chosen = {i: fallback for i in order[:n_keep]}
        w = dict(base) | emb
        for i, q in table["_quantized"].items():
            w |= fb[i] if i in chosen else q
        p = math.exp(nll(ck, w, ids) / (len(ids) - 1))
        inc = (p / fp32 - 1) * 100
        steps.append({"layers_in_fallback": n_keep, "perplexity": round(p, 4), "increase_pct": round(inc, 3)})
        if progress:
            progress(f"      {n_keep} layers in {fallback}: perplexity {p:.3f} (+{inc:.2f} %)")
        if inc <= budget_pct:
            return chosen, {"budget_pct": budget_pct, "fallback": fallback, "steps": steps, "met": True}
    raise BudgetError(
        f"even with every layer in {fallback} the perplexity is +{steps[-1]['increase_pct']:.2f} % over fp32, "
        f"above the budget of {budget_pct} %: use a wider precision"
    )
