"""LLMs: Llama-family checkpoints (GGUF, Hugging Face safetensors) to paged-KV-cache decoder artifacts.

Build side only (it imports the TVM compiler); the device runs artifacts with
:mod:`inferx_edge.runtime.llm` and :mod:`inferx_edge.runtime.llm_scheduler`.
"""

from __future__ import annotations

from pathlib import Path


def is_llm_checkpoint(path) -> bool:
    """A ``.gguf`` file or a Hugging Face directory with ``config.json``: built by :mod:`inferx_edge.llm.build`
    (cheap: ``build`` asks this of every model before importing anything heavy)."""
    path = Path(path)
    return path.suffix == ".gguf" or (path.is_dir() and (path / "config.json").is_file())
