"""Reading Llama-family checkpoints: GGUF files (llama.cpp) and Hugging Face safetensors directories.

Both end as one :class:`Checkpoint`: the config, float32 weights under our names (``layers.3.q``...,
in PyTorch ``[out, in]`` layout and Hugging Face rotary order) and the tokenizer as a ``tokenizers``
JSON string. GGUF q/k projections are stored permuted for llama.cpp's interleaved rotary embedding;
they are permuted back here, so every checkpoint meets the same model code.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np

from inferx_edge.errors import ModelError
from inferx_edge.llm.config import SUPPORTED_ARCHITECTURES, LlamaConfig

#: GGUF tensor names → ours (``{i}``: the layer).
_GGUF_NAMES = {
    "token_embd.weight": "embed_tokens",
    "output_norm.weight": "norm",
    "output.weight": "lm_head",
    "blk.{i}.attn_norm.weight": "layers.{i}.input_layernorm",
    "blk.{i}.attn_q.weight": "layers.{i}.q",
    "blk.{i}.attn_k.weight": "layers.{i}.k",
    "blk.{i}.attn_v.weight": "layers.{i}.v",
    "blk.{i}.attn_output.weight": "layers.{i}.o",
    "blk.{i}.ffn_norm.weight": "layers.{i}.post_attention_layernorm",
    "blk.{i}.ffn_gate.weight": "layers.{i}.gate",
    "blk.{i}.ffn_up.weight": "layers.{i}.up",
    "blk.{i}.ffn_down.weight": "layers.{i}.down",
}
#: Hugging Face tensor names → ours.
_HF_NAMES = {
    "model.embed_tokens.weight": "embed_tokens",
    "model.norm.weight": "norm",
    "lm_head.weight": "lm_head",
    "model.layers.{i}.input_layernorm.weight": "layers.{i}.input_layernorm",
    "model.layers.{i}.self_attn.q_proj.weight": "layers.{i}.q",
    "model.layers.{i}.self_attn.k_proj.weight": "layers.{i}.k",
    "model.layers.{i}.self_attn.v_proj.weight": "layers.{i}.v",
    "model.layers.{i}.self_attn.o_proj.weight": "layers.{i}.o",
    "model.layers.{i}.post_attention_layernorm.weight": "layers.{i}.post_attention_layernorm",
    "model.layers.{i}.mlp.gate_proj.weight": "layers.{i}.gate",
    "model.layers.{i}.mlp.up_proj.weight": "layers.{i}.up",
    "model.layers.{i}.mlp.down_proj.weight": "layers.{i}.down",
}


@dataclasses.dataclass
class Checkpoint:
    config: LlamaConfig
    weights: dict[str, np.ndarray]
    tokenizer_json: str | None
    chat_template: str | None
    source: dict[str, Any]


def load_checkpoint(path: str | Path) -> Checkpoint:
    """Load a ``.gguf`` file or a Hugging Face directory (``config.json`` + ``*.safetensors``)."""
    path = Path(path)
    if not path.exists():
        raise ModelError(f"LLM checkpoint {path} does not exist")
    if path.is_dir():
        return _load_hf(path)
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != b"GGUF":
        raise ModelError(
            f"{path} is not a GGUF file (magic {magic!r}); LLM checkpoints are .gguf files or Hugging Face "
            "directories with config.json and .safetensors weights"
        )
    return _load_gguf(path)


def _rename(name: str, table: dict[str, str], n_layers: int) -> str | None:
    for pattern, ours in table.items():
        if "{i}" not in pattern:
            if name == pattern:
                return ours
            continue
        head, tail = pattern.split("{i}")
        if name.startswith(head) and name.endswith(tail):
            mid = name[len(head) : len(name) - len(tail)]
            if mid.isdigit() and int(mid) < n_layers:
                return ours.replace("{i}", mid)
    return None


def _check_weights(cfg: LlamaConfig, weights: dict[str, np.ndarray], where: Path) -> None:
    hd, nq, nkv, h, f = (
        cfg.head_dim,
        cfg.num_attention_heads,
        cfg.num_key_value_heads,
        cfg.hidden_size,
        cfg.intermediate_size,
    )
    want = {"embed_tokens": (cfg.vocab_size, h), "norm": (h,)}
    if not cfg.tie_word_embeddings:
        want["lm_head"] = (cfg.vocab_size, h)
    for i in range(cfg.num_hidden_layers):
        want.update({
            f"layers.{i}.input_layernorm": (h,), f"layers.{i}.post_attention_layernorm": (h,),
            f"layers.{i}.q": (nq * hd, h), f"layers.{i}.k": (nkv * hd, h), f"layers.{i}.v": (nkv * hd, h),
            f"layers.{i}.o": (h, nq * hd), f"layers.{i}.gate": (f, h), f"layers.{i}.up": (f, h),
            f"layers.{i}.down": (h, f),
        })  # fmt: skip
    missing = sorted(set(want) - set(weights))
    if missing:
        raise ModelError(f"{where}: missing tensors {missing[:6]}{' ...' if len(missing) > 6 else ''}")
    for name, shape in want.items():
        if tuple(weights[name].shape) != shape:
            raise ModelError(f"{where}: tensor {name} has shape {tuple(weights[name].shape)}, the config needs {shape}")
        if not np.isfinite(weights[name]).all():
            raise ModelError(f"{where}: tensor {name} holds NaN or infinite values")


def _unpermute_rotary(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's q/k row permutation (interleaved rotary pairs → Hugging Face half split)."""
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _load_gguf(path: Path) -> Checkpoint:
    try:
        import gguf
    except ImportError as exc:
        raise ModelError("reading GGUF checkpoints needs the 'gguf' package: pip install 'inferx_edge[llm]'") from exc
    try:
        reader = gguf.GGUFReader(str(path))
    except Exception as exc:  # truncated or corrupt files raise anything from ValueError to IndexError
        raise ModelError(f"{path}: not a readable GGUF file ({type(exc).__name__}: {exc})") from exc

    def field(key: str, default: Any = None) -> Any:
        f = reader.fields.get(key)
        return default if f is None else f.contents()

    arch = field("general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ModelError(
            f"{path}: GGUF architecture '{arch}' is not supported; supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
        )
    n_head = int(field(f"{arch}.attention.head_count"))
    hidden = int(field(f"{arch}.embedding_length"))
    head_dim = int(field(f"{arch}.attention.key_length", hidden // n_head))
    rot = field(f"{arch}.rope.dimension_count", head_dim)
    if int(rot) != head_dim:
        raise ModelError(f"{path}: partial rotary embeddings ({rot} of {head_dim} dims) are not supported")
    if field(f"{arch}.rope.scaling.type") not in (None, "none"):
        raise ModelError(f"{path}: RoPE scaling '{field(f'{arch}.rope.scaling.type')}' is not supported")
    tokens = field("tokenizer.ggml.tokens")
    eos = field("tokenizer.ggml.eos_token_id")
    eot = [i for i, t in enumerate(tokens or []) if t in ("<|im_end|>", "<|eot_id|>", "<|end|>")]
    weights: dict[str, np.ndarray] = {}
    n_layers = int(field(f"{arch}.block_count"))
    n_kv = int(field(f"{arch}.attention.head_count_kv", n_head))
    for t in reader.tensors:
        ours = _rename(t.name, _GGUF_NAMES, n_layers)
        if ours is None:
            continue
        try:
            w = np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32)
        except Exception as exc:
            raise ModelError(f"{path}: tensor {t.name} of type {t.tensor_type.name} cannot be read: {exc}") from exc
        w = w.reshape([int(d) for d in reversed(t.shape)])
        if ours.endswith(".q"):
            w = _unpermute_rotary(w, n_head)
        elif ours.endswith(".k"):
            w = _unpermute_rotary(w, n_kv)
        weights[ours] = w
    vocab = int(field(f"{arch}.vocab_size", len(tokens) if tokens else weights["embed_tokens"].shape[0]))
    cfg = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=int(field(f"{arch}.feed_forward_length")),
        num_hidden_layers=n_layers,
        num_attention_heads=n_head,
        num_key_value_heads=n_kv,
        head_dim=head_dim,
        rms_norm_eps=float(field(f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)),
        rope_theta=float(field(f"{arch}.rope.freq_base", 10000.0)),
        context_length=int(field(f"{arch}.context_length", 2048)),
        tie_word_embeddings="lm_head" not in weights,
        architecture=arch,
        bos_token_id=field("tokenizer.ggml.bos_token_id"),
        eos_token_ids=tuple(sorted({int(eos)} | set(eot))) if eos is not None else tuple(eot),
    )
    _check_weights(cfg, weights, path)
    types = sorted({t.tensor_type.name for t in reader.tensors})
    tok = _gguf_tokenizer(reader, field) if tokens else None
    return Checkpoint(cfg, weights, tok, field("tokenizer.chat_template"), {"format": "gguf", "tensor_types": types})


def _gguf_tokenizer(reader: Any, field: Any) -> str:
    """A ``tokenizers`` JSON for the GGUF vocabulary (byte-level BPE: the ``gpt2`` GGUF tokenizer model)."""
    from inferx_edge.llm.tokenizer import byte_level_bpe_json

    model = field("tokenizer.ggml.model")
    if model != "gpt2":
        raise ModelError(f"GGUF tokenizer model '{model}' is not supported; supported: gpt2 (byte-level BPE)")
    types = field("tokenizer.ggml.token_type") or []
    return byte_level_bpe_json(
        tokens=list(field("tokenizer.ggml.tokens")),
        merges=list(field("tokenizer.ggml.merges") or []),
        special=[i for i, t in enumerate(types) if int(t) in (3, 4)],  # CONTROL, USER_DEFINED
        pre=field("tokenizer.ggml.pre", "default"),
        add_bos=bool(field("tokenizer.ggml.add_bos_token", False)),
        bos_id=field("tokenizer.ggml.bos_token_id"),
    )


def _load_hf(path: Path) -> Checkpoint:
    cfg_path = path / "config.json"
    if not cfg_path.is_file():
        raise ModelError(f"{path}: a Hugging Face checkpoint directory needs config.json")
    hf = json.loads(cfg_path.read_text())
    arch = hf.get("model_type")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ModelError(
            f"{path}: model_type '{arch}' is not supported; supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
        )
    rope = hf.get("rope_parameters") or {}
    scaling = hf.get("rope_scaling") or (rope if rope.get("rope_type", "default") != "default" else None)
    if scaling:
        raise ModelError(f"{path}: RoPE scaling {scaling} is not supported (plain rotary embeddings only)")
    for flag in ("attention_bias", "mlp_bias"):
        if hf.get(flag):
            raise ModelError(f"{path}: {flag} is set; only bias-free Llama blocks are supported")
    if hf.get("hidden_act", "silu") != "silu":
        raise ModelError(f"{path}: hidden_act '{hf['hidden_act']}' is not supported (SwiGLU with silu only)")
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ModelError(f"{path}: no .safetensors weights")
    from safetensors.numpy import load_file

    n_layers = int(hf["num_hidden_layers"])
    weights = {}
    for file in files:
        for name, w in load_file(str(file)).items():
            ours = _rename(name, _HF_NAMES, n_layers)
            if ours is not None:
                weights[ours] = np.asarray(w, dtype=np.float32)
    n_head = int(hf["num_attention_heads"])
    eos = hf.get("eos_token_id")
    cfg = LlamaConfig(
        vocab_size=int(hf["vocab_size"]),
        hidden_size=int(hf["hidden_size"]),
        intermediate_size=int(hf["intermediate_size"]),
        num_hidden_layers=n_layers,
        num_attention_heads=n_head,
        num_key_value_heads=int(hf.get("num_key_value_heads", n_head)),
        head_dim=int(hf.get("head_dim") or hf["hidden_size"] // n_head),
        rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        rope_theta=float(hf.get("rope_theta") or rope.get("rope_theta") or 10000.0),
        context_length=int(hf.get("max_position_embeddings", 2048)),
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", "lm_head" not in weights)),
        architecture=arch,
        bos_token_id=hf.get("bos_token_id"),
        eos_token_ids=tuple(eos if isinstance(eos, list) else [] if eos is None else [eos]),
    )
    _check_weights(cfg, weights, path)
    tok_path = path / "tokenizer.json"
    tok = tok_path.read_text() if tok_path.is_file() else None
    template = None
    tc = path / "tokenizer_config.json"
    if tc.is_file():
        template = json.loads(tc.read_text()).get("chat_template")
    return Checkpoint(cfg, weights, tok, template, {"format": "safetensors", "files": [f.name for f in files]})
