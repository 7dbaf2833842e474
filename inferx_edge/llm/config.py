"""The decoder description an LLM artifact is built from and run with (Llama family)."""

from __future__ import annotations

import dataclasses
from typing import Any

from inferx_edge.errors import ModelError

#: Architectures the loader turns into :class:`LlamaConfig` (GGUF ``general.architecture`` / HF
#: ``model_type``). All share the Llama block: RMSNorm, rotary attention with grouped KV heads, SwiGLU.
SUPPORTED_ARCHITECTURES = ("llama", "mistral")


@dataclasses.dataclass(frozen=True)
class LlamaConfig:
    """One Llama-family decoder. Every field is checked in ``__post_init__``."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    context_length: int = 2048
    tie_word_embeddings: bool = True
    architecture: str = "llama"
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        for field in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "head_dim"):
            if int(getattr(self, field)) <= 0:
                raise ModelError(f"LLM config: {field} must be positive, got {getattr(self, field)}")
        if self.architecture not in SUPPORTED_ARCHITECTURES:
            raise ModelError(
                f"LLM architecture '{self.architecture}' is not supported; supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
            )
        if self.num_attention_heads <= 0 or self.num_key_value_heads <= 0:
            raise ModelError("LLM config: head counts must be positive")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ModelError(
                f"LLM config: {self.num_attention_heads} query heads are not a multiple of "
                f"{self.num_key_value_heads} key/value heads"
            )
        if self.head_dim % 2:
            raise ModelError(f"LLM config: rotary embeddings need an even head_dim, got {self.head_dim}")

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["eos_token_ids"] = list(self.eos_token_ids)
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> LlamaConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ModelError(f"LLM config: unknown keys {sorted(unknown)}; known: {sorted(known)}")
        d = dict(d)
        d["eos_token_ids"] = tuple(d.get("eos_token_ids", ()))
        return cls(**d)

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """Key + value cache bytes one token takes across all layers."""
        return 2 * self.num_hidden_layers * self.num_key_value_heads * self.head_dim * dtype_bytes
