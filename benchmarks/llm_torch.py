"""A Llama decoder in plain torch with a static KV cache: the GPU peer of the LLM benchmarks where
transformers is not installed (the H200 host). Checked against transformers by
``python -m benchmarks.llm_torch --check CHECKPOINT`` (CPU, fp32, real weights).

Every sequence of a batch sits at the same position (benchmark prompts have equal lengths), so the
decode step has static shapes: attention runs over the whole cache under a position mask. Weights and
the cache are module buffers (as in gpt-fast), so ``torch.compile(mode="reduce-overhead")`` treats
them as static and captures the step, cache writes included, in a CUDA graph.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
import torch
import torch.nn.functional as F


class TorchLlama(torch.nn.Module):
    def __init__(self, weights: dict[str, np.ndarray], cfg: dict, device, dtype, max_batch: int, max_len: int):
        super().__init__()
        t = lambda a: torch.from_numpy(np.ascontiguousarray(a)).to(device=device, dtype=dtype)  # noqa: E731
        self.cfg, self.L = cfg, cfg["num_hidden_layers"]
        self.nq, self.nkv, self.hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
        self.eps = cfg["rms_norm_eps"]
        self.register_buffer("embed", t(weights["embed_tokens"]))
        self.register_buffer("lm_head", self.embed if cfg["tie_word_embeddings"] else t(weights["lm_head"]))
        self.register_buffer("norm", t(weights["norm"]))
        for i in range(self.L):
            w = lambda n: weights[f"layers.{i}.{n}"]  # noqa: E731, B023
            layer = {
                "ln1": t(w("input_layernorm")), "ln2": t(w("post_attention_layernorm")),
                "qkv": t(np.concatenate([w("q"), w("k"), w("v")])), "o": t(w("o")),
                "gate_up": t(np.concatenate([w("gate"), w("up")])), "down": t(w("down")),
            }  # fmt: skip
            for name, value in layer.items():
                self.register_buffer(f"l{i}_{name}", value)
        self.register_buffer(
            "k", torch.zeros(self.L, max_batch, self.nkv, max_len, self.hd, device=device, dtype=dtype)
        )
        self.register_buffer("v", torch.zeros_like(self.k))
        inv = 1.0 / cfg["rope_theta"] ** (torch.arange(0, self.hd, 2, device=device, dtype=torch.float32) / self.hd)
        ang = torch.outer(torch.arange(max_len, device=device, dtype=torch.float32), inv)
        ang = torch.cat([ang, ang], dim=-1)
        self.register_buffer("cos", ang.cos().to(dtype))
        self.register_buffer("sin", ang.sin().to(dtype))
        self.max_len = max_len

    def _rms(self, x, w):
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * w

    def _rope(self, x, pos):  # x [B, H, S, D], pos [S]
        cos, sin = self.cos[pos][None, None], self.sin[pos][None, None]
        half = self.hd // 2
        rot = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return x * cos + rot * sin

    def forward(self, ids: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
        """``ids`` [B, S] at positions ``start + arange(S)`` (``start``: a 0-d long tensor); logits [B, S, V]."""
        B, S = ids.shape
        pos = start + torch.arange(S, device=ids.device)
        x = self.embed[ids]
        keys = torch.arange(self.max_len, device=ids.device)
        mask = keys[None, :] <= pos[:, None]  # [S, max_len]: causal over what the cache holds
        for i in range(self.L):
            lw = {n: getattr(self, f"l{i}_{n}") for n in ("ln1", "ln2", "qkv", "o", "gate_up", "down")}
            h = self._rms(x, lw["ln1"]) @ lw["qkv"].T
            q, k, v = h.split([self.nq * self.hd, self.nkv * self.hd, self.nkv * self.hd], dim=-1)
            q = self._rope(q.view(B, S, self.nq, self.hd).transpose(1, 2), pos)
            k = self._rope(k.view(B, S, self.nkv, self.hd).transpose(1, 2), pos)
            v = v.view(B, S, self.nkv, self.hd).transpose(1, 2)
            self.k[i, :B, :, pos] = k
            self.v[i, :B, :, pos] = v
            a = F.scaled_dot_product_attention(q, self.k[i, :B], self.v[i, :B], attn_mask=mask, enable_gqa=True)
            x = x + a.transpose(1, 2).reshape(B, S, self.nq * self.hd) @ lw["o"].T
            g, u = (self._rms(x, lw["ln2"]) @ lw["gate_up"].T).chunk(2, dim=-1)
            x = x + (F.silu(g) * u) @ lw["down"].T
        return (self._rms(x, self.norm) @ self.lm_head.T).float()


def _check(path: str) -> int:
    """Logits and greedy tokens of this implementation against transformers (fp32, CPU, real weights)."""
    import transformers

    from inferx_edge.llm.checkpoint import load_checkpoint

    ck = load_checkpoint(path)
    cfg = ck.config.to_json()
    ours = TorchLlama(ck.weights, cfg, "cpu", torch.float32, 1, 256)
    p = __import__("pathlib").Path(path)
    ref = transformers.AutoModelForCausalLM.from_pretrained(p.parent, gguf_file=p.name, dtype=torch.float32).eval()
    ids = torch.tensor([[1, 4093, 198, 19556, 905, 17, 378, 713, 216, 34, 32, 34, 36, 436]])
    with torch.no_grad():
        a = ours.forward(ids, torch.tensor(0))
        b = ref(ids).logits
    err = float((a - b).abs().max() / b.abs().max())
    print(f"max |logit difference| / max |logit|: {err:.2e}")
    return 0 if err < 1e-4 else 1


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", required=True, metavar="CHECKPOINT")
    sys.exit(_check(ap.parse_args().check))
