"""Turning a GGUF vocabulary into a ``tokenizers`` JSON the artifact carries."""

from __future__ import annotations

from inferx_edge.errors import ModelError

# llama.cpp's pre-tokenizer names (``tokenizer.ggml.pre``) whose Hugging Face equivalent splits digits
# one by one before the GPT-2 byte-level regex.
_DIGIT_SPLITTING_PRE = {"smollm", "starcoder", "refact", "qwen2", "deepseek-coder"}


def byte_level_bpe_json(
    tokens: list[str],
    merges: list[str],
    special: list[int],
    pre: str = "default",
    add_bos: bool = False,
    bos_id: int | None = None,
) -> str:
    """A byte-level BPE tokenizer (GPT-2 style) as ``tokenizers`` JSON."""
    try:
        from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors
    except ImportError as exc:
        raise ModelError("building the tokenizer needs 'tokenizers': pip install 'inferx_edge[llm]'") from exc
    vocab = {t: i for i, t in enumerate(tokens)}
    if len(vocab) != len(tokens):
        raise ModelError("GGUF tokenizer: the vocabulary holds duplicate tokens")
    pairs = []
    for m in merges:
        parts = m.split(" ")
        if len(parts) != 2:
            raise ModelError(f"GGUF tokenizer: malformed merge {m!r}")
        pairs.append((parts[0], parts[1]))
    tk = Tokenizer(models.BPE(vocab=vocab, merges=pairs, fuse_unk=False, byte_fallback=False))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre in _DIGIT_SPLITTING_PRE:
        tk.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    else:
        tk.pre_tokenizer = byte_level
    tk.decoder = decoders.ByteLevel()
    tk.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False) for i in special])
    if add_bos and bos_id is not None:
        bos = tokens[int(bos_id)]
        tk.post_processor = processors.TemplateProcessing(single=f"{bos} $A", special_tokens=[(bos, int(bos_id))])
    else:
        tk.post_processor = processors.ByteLevel(trim_offsets=False)
    return tk.to_str()
