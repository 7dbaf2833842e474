"""LLMEngine: an LLM artifact loaded onto a device, with its paged KV cache allocated once.

Sequences enter the cache with :meth:`LLMEngine.add_sequence` and leave it (pages back to the pool)
with :meth:`LLMEngine.remove_sequence`; :meth:`prefill` and :meth:`decode` run one forward step for
any set of sequences and return the next-token logits. Scheduling (which sequences run in which
step) lives in :mod:`inferx_edge.runtime.llm_scheduler`. Needs only the TVM runtime and numpy (and
``tokenizers`` for text in and out).
"""

from __future__ import annotations

import json
import math
import os
import threading
import weakref
from pathlib import Path
from typing import Any

import numpy as np

from inferx_edge.errors import ArtifactError, InputError
from inferx_edge.package import open_artifact
from inferx_edge.runtime._tvm import import_tvm_runtime
from inferx_edge.runtime.engine import LoadedVariant, open_device


class Tokenizer:
    """The artifact's ``tokenizers`` JSON, with incremental detokenization for streams."""

    def __init__(self, path: Path) -> None:
        try:
            from tokenizers import Tokenizer as _Tokenizer
        except ImportError as exc:
            raise ArtifactError("text input needs the 'tokenizers' package: pip install 'inferx_edge[llm]'") from exc
        self._tk = _Tokenizer.from_file(str(path))

    def encode(self, text: str) -> list[int]:
        return self._tk.encode(text, add_special_tokens=True).ids

    def decode(self, ids: list[int]) -> str:
        return self._tk.decode(ids, skip_special_tokens=True)

    def token_id(self, token: str) -> int | None:
        return self._tk.token_to_id(token)


class TextStream:
    """Token ids in, text deltas out; holds back an incomplete UTF-8 character."""

    def __init__(self, tokenizer) -> None:
        self.tk, self.ids, self.prefix, self.read = tokenizer, [], 0, 0

    def push(self, token: int) -> str:
        self.ids.append(token)
        before = self.tk.decode(self.ids[self.prefix : self.read])
        text = self.tk.decode(self.ids[self.prefix :])
        if text.endswith("\ufffd") or len(text) <= len(before):
            return ""
        self.prefix, self.read = self.read, len(self.ids)
        return text[len(before) :]

    def flush(self) -> str:
        """What is held back at the end of the stream (bytes that never became a valid character)."""
        before = self.tk.decode(self.ids[self.prefix : self.read])
        text = self.tk.decode(self.ids[self.prefix :])
        self.prefix = self.read = len(self.ids)
        return text[len(before) :]


def _optional_function(vm, name: str):
    """``vm[name]``, or None when the artifact was built without it."""
    try:
        return vm[name]
    except Exception:  # noqa: BLE001 - TVM raises its own error type for a missing function
        return None


def is_llm_artifact(path) -> bool:
    """Whether ``path`` is an artifact file whose manifest says ``model.kind == "llm"`` (False for
    directories and for files that are no readable artifact: their own loader names the fault)."""
    from inferx_edge.errors import InferxError
    from inferx_edge.package import read_manifest

    if not Path(path).is_file():
        return False
    try:
        return read_manifest(path).model.get("kind") == "llm"
    except InferxError:
        return False


class LLMEngine:
    """Load an LLM artifact (``model.kind == "llm"``) and run prefill/decode steps on its KV cache.

    Parameters
    ----------
    max_sequences : sequences the cache holds at once (the decode batch bound).
    kv_tokens : tokens the cache holds over all sequences (pages × page size); default enough for
        ``max_sequences`` sequences of 1/4 context each, at least one full context.
    prefill_chunk : most tokens one prefill step processes (longer prompts take several steps).
    """

    def __init__(
        self,
        path: str | os.PathLike,
        variant: str | None = None,
        device_id: int = 0,
        trust=None,
        max_sequences: int = 8,
        kv_tokens: int | None = None,
        page_size: int = 16,
        prefill_chunk: int = 256,
    ) -> None:
        self._tvm = tvm = import_tvm_runtime()
        self.path = Path(path)
        self._lock = threading.RLock()
        self._extracted = open_artifact(self.path, trust=trust)
        self._finalizer = weakref.finalize(self, self._extracted.close)
        try:
            manifest = self._extracted.manifest
            if manifest.model.get("kind") != "llm":
                raise ArtifactError(
                    f"{self.path} is not an LLM artifact (model kind '{manifest.model.get('kind', 'cnn')}')"
                )
            self.device = open_device(tvm, self._extracted, variant, device_id, self.path, trust)
            loaded = LoadedVariant(tvm, manifest.variant(variant), self._extracted, self.device, entry=None)
            self.variant, self._vm, self._params = loaded.variant, loaded.vm, loaded.params
            meta = json.loads(self._extracted.member("llm/config.json").read_text())
            self.config: dict[str, Any] = meta["config"]
            self.chat_template: str | None = meta.get("chat_template")
            tok = "llm/tokenizer.json"
            self.tokenizer = Tokenizer(self._extracted.member(tok)) if tok in manifest.files else None
            self.dtype = self.variant.extra["llm"]["dtype"]
            self._prefill = self._vm["batch_prefill"]
            self._decode = self._vm["batch_decode"]
            self._argmax = _optional_function(self._vm, "argmax_logits")  # GPU artifacts
            self.context_length = int(self.config["context_length"])
            self.max_sequences = int(max_sequences)
            self.page_size = int(page_size)
            self.prefill_chunk = int(prefill_chunk)
            if self.max_sequences < 1 or self.page_size < 1 or self.prefill_chunk < 1:
                raise InputError("max_sequences, page_size and prefill_chunk must be positive")
            want = kv_tokens or max(self.context_length, self.max_sequences * self.context_length // 4)
            self.total_pages = math.ceil(int(want) / self.page_size)
            self.kv_tokens = self.total_pages * self.page_size
            S = tvm.runtime.ShapeTuple
            self._kv = self._vm["create_paged_kv_cache"](
                S([self.max_sequences]), S([self.kv_tokens]), S([self.prefill_chunk]), S([self.page_size]), S([0])
            )
            g = tvm.get_global_func
            self._add = g("vm.builtin.kv_state_add_sequence")
            self._remove = g("vm.builtin.kv_state_remove_sequence")
            self._begin = g("vm.builtin.kv_state_begin_forward")
            self._end = g("vm.builtin.kv_state_end_forward")
            self._available = g("vm.builtin.attention_kv_cache_get_num_available_pages")
            self._seq_len = g("vm.builtin.attention_kv_cache_get_sequence_length")
            self._sequences: set[int] = set()
        except BaseException:
            self._extracted.close()
            raise

    @property
    def manifest(self):
        return self._extracted.manifest

    @property
    def provenance(self):
        """Who signed the artifact and whether it was verified (as :attr:`Engine.provenance`)."""
        return self._extracted.provenance

    @property
    def vocab_size(self) -> int:
        return int(self.config["vocab_size"])

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        return tuple(self.config.get("eos_token_ids") or ())

    @property
    def free_pages(self) -> int:
        with self._lock:
            return int(self._available(self._kv))

    def sequence_length(self, seq_id: int) -> int:
        with self._lock:
            return int(self._seq_len(self._kv, seq_id))

    def add_sequence(self, seq_id: int) -> None:
        with self._lock:
            if seq_id in self._sequences:
                raise InputError(f"sequence {seq_id} is already in the KV cache")
            if len(self._sequences) >= self.max_sequences:
                raise InputError(f"the KV cache holds {self.max_sequences} sequences at most")
            self._add(self._kv, int(seq_id))
            self._sequences.add(seq_id)

    def remove_sequence(self, seq_id: int) -> None:
        """Drop a sequence and return its pages (a no-op for an unknown id)."""
        with self._lock:
            if seq_id in self._sequences:
                self._remove(self._kv, int(seq_id))
                self._sequences.discard(seq_id)

    def _ids(self, tokens: np.ndarray):
        if tokens.size and (tokens.min() < 0 or tokens.max() >= self.vocab_size):
            raise InputError(f"token ids must lie in [0, {self.vocab_size})")
        return self._tvm.runtime.tensor(tokens.astype(np.int32), self.device)

    def prefill(self, seq_ids: list[int], tokens: list[list[int]], all_logits: bool = False) -> np.ndarray:
        """Append ``tokens[i]`` to sequence ``seq_ids[i]`` in one step; the logits after each sequence's
        last token (``[len(seq_ids), vocab]``), or after every token with ``all_logits``."""
        lengths = [len(t) for t in tokens]
        if not seq_ids or min(lengths) < 1 or len(seq_ids) != len(tokens):
            raise InputError("prefill needs one non-empty token list per sequence")
        if sum(lengths) > self.prefill_chunk:
            raise InputError(f"a prefill step takes at most {self.prefill_chunk} tokens, got {sum(lengths)}")
        flat = np.concatenate([np.asarray(t, dtype=np.int32) for t in tokens])
        ends = np.cumsum(lengths) - 1
        positions = np.arange(flat.size, dtype=np.int32) if all_logits else ends.astype(np.int32)
        tvm = self._tvm
        with self._lock:
            ids = self._ids(flat)
            self._begin(self._kv, tvm.runtime.ShapeTuple(seq_ids), tvm.runtime.ShapeTuple(lengths))
            try:
                logits, self._kv = self._prefill(
                    ids, tvm.runtime.tensor(positions, self.device), self._kv, self._params
                )
            finally:
                self._end(self._kv)
            return logits.numpy()[0]

    def decode(self, seq_ids: list[int], tokens: list[int]) -> np.ndarray:
        """Append one token to each sequence; the next-token logits ``[len(seq_ids), vocab]``."""
        with self._lock:
            return self._decode_step(seq_ids, tokens).numpy()[:, 0]

    def decode_greedy(self, seq_ids: list[int], tokens: list[int]) -> np.ndarray:
        """Append one token to each sequence; each one's most likely next token (``[len(seq_ids)]``
        int). GPU artifacts take the argmax on the device, so only the ids cross to the host (at 32
        sequences the logits are 6 MB a step); ties go to the lowest id either way."""
        with self._lock:
            logits = self._decode_step(seq_ids, tokens)
            if self._argmax is None:
                return logits.numpy()[:, 0].argmax(axis=1)
            return self._argmax(logits).numpy().astype(np.int64)

    def _decode_step(self, seq_ids: list[int], tokens: list[int]):
        if not seq_ids or len(seq_ids) != len(tokens):
            raise InputError("decode needs one token per sequence")
        tvm = self._tvm
        ids = self._ids(np.asarray(tokens, dtype=np.int32))
        self._begin(self._kv, tvm.runtime.ShapeTuple(seq_ids), tvm.runtime.ShapeTuple([1] * len(seq_ids)))
        try:
            logits, self._kv = self._decode(ids, self._kv, self._params)
        finally:
            self._end(self._kv)
        return logits

    def score(self, tokens: list[int], seq_id: int = 2**30) -> float:
        """Sum of the negative log-likelihoods of ``tokens[1:]`` (for perplexity); one temporary sequence."""
        nll = 0.0
        self.add_sequence(seq_id)
        try:
            for start in range(0, len(tokens) - 1, self.prefill_chunk):
                chunk = tokens[start : start + self.prefill_chunk]
                logits = self.prefill([seq_id], [chunk], all_logits=True).astype(np.float64)
                targets = tokens[start + 1 : start + 1 + len(chunk)]
                logits = logits[: len(targets)]
                m = logits.max(axis=1, keepdims=True)
                logz = np.log(np.exp(logits - m).sum(axis=1)) + m[:, 0]
                nll += float((logz - logits[np.arange(len(targets)), targets]).sum())
        finally:
            self.remove_sequence(seq_id)
        return nll

    def render_chat(self, messages: list[dict[str, Any]]) -> str:
        """The prompt text for OpenAI-style chat ``messages`` under the checkpoint's chat template
        (Jinja, sandboxed as Hugging Face renders it)."""
        if not self.chat_template:
            raise InputError("this model has no chat template: use a completion (plain prompt) instead")
        if not isinstance(messages, list) or not messages:
            raise InputError("'messages' must be a non-empty list of {role, content} objects")
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
                raise InputError(f"messages[{i}] must be an object with string 'role' and 'content'")
        try:
            from jinja2.sandbox import ImmutableSandboxedEnvironment
        except ImportError as exc:
            raise ArtifactError("chat prompts need 'jinja2': pip install 'inferx_edge[llm]'") from exc
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        try:
            return env.from_string(self.chat_template).render(messages=messages, add_generation_prompt=True)
        except Exception as exc:
            raise InputError(f"the chat template failed on these messages: {exc}") from exc

    def encode(self, text: str) -> list[int]:
        if self.tokenizer is None:
            raise InputError("this artifact carries no tokenizer: send token ids")
        return self.tokenizer.encode(text)

    def close(self) -> None:
        with self._lock:
            self._params = []
            self._kv = None
            self._finalizer()

    def __enter__(self) -> LLMEngine:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
