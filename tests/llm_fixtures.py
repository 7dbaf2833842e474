"""A tiny random Llama checkpoint (Hugging Face layout, byte-level tokenizer, ChatML template) for tests."""

from __future__ import annotations

import json
from pathlib import Path

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def byte_tokens() -> list[str]:
    """GPT-2's byte -> printable-unicode table, in byte order."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    table = dict(zip(bs, cs))
    return [chr(table[b]) for b in range(256)]


def write_tiny_llama(out: Path, seed: int = 0, layers: int = 2) -> Path:
    import torch
    import transformers

    from inferx_edge.llm.tokenizer import byte_level_bpe_json

    tokens = byte_tokens() + SPECIAL
    cfg = transformers.LlamaConfig(
        vocab_size=len(tokens), hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, rope_theta=10000.0, tie_word_embeddings=True,
        rms_norm_eps=1e-5, max_position_embeddings=256, initializer_range=0.25,
        bos_token_id=None, eos_token_id=256 + SPECIAL.index("<|im_end|>"),
    )  # fmt: skip
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(cfg).eval()
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    (out / "tokenizer.json").write_text(
        byte_level_bpe_json(tokens, [], special=list(range(256, len(tokens))), pre="default")
    )
    (out / "tokenizer_config.json").write_text(json.dumps({"chat_template": CHATML}))
    return out
