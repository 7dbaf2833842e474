"""LLMs: Llama-family checkpoints (GGUF, Hugging Face safetensors) to paged-KV-cache decoder artifacts.

Build side only (it imports the TVM compiler); the device runs artifacts with
:mod:`inferx_edge.runtime.llm` and :mod:`inferx_edge.runtime.llm_scheduler`.
"""
