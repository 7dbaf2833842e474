"""Continuous batching over an :class:`~inferx_edge.runtime.llm.LLMEngine`.

One thread runs steps. Each step (1) admits waiting requests while the KV cache has room for their
whole prompt + ``max_tokens`` (pages are reserved up front, so a running sequence never runs out
mid-stream), (2) runs **one** prefill chunk of at most ``prefill_chunk`` tokens for the sequences
still reading their prompt, (3) runs **one** decode step for every sequence that is generating.
New requests join the running decode batch at the next step, and a long prompt is read a chunk at
a time between decode steps instead of stalling the streams already running.

Results go to each request's ``emit`` callback from the scheduler thread: ``("token", id)``, then
``("done", finish_reason)`` (``stop``, ``length``, ``cancelled``) or ``("error", message)``.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import threading
import time
from collections import deque
from collections.abc import Callable

import numpy as np

from inferx_edge.errors import InputError


class QueueFull(Exception):
    """The scheduler's waiting queue is full: answer 503 and let the client retry."""


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """OpenAI-style sampling: ``temperature`` 0 is greedy; ``top_k`` 0 and ``top_p`` 1 turn those off."""

    max_tokens: int = 64
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        def bad(field: str, rule: str):
            raise InputError(f"invalid sampling parameter {field}={getattr(self, field)!r}: {rule}")

        if not isinstance(self.max_tokens, int) or isinstance(self.max_tokens, bool) or self.max_tokens < 1:
            bad("max_tokens", "must be an integer >= 1")
        if not isinstance(self.temperature, (int, float)) or not 0 <= self.temperature <= 2:
            bad("temperature", "must be a number in [0, 2]")
        if not isinstance(self.top_p, (int, float)) or not 0 < self.top_p <= 1:
            bad("top_p", "must be a number in (0, 1]")
        if not isinstance(self.top_k, int) or isinstance(self.top_k, bool) or self.top_k < 0:
            bad("top_k", "must be an integer >= 0 (0: off)")
        if self.seed is not None and (not isinstance(self.seed, int) or isinstance(self.seed, bool)):
            bad("seed", "must be an integer")


def sample(logits: np.ndarray, p: SamplingParams, rng: np.random.Generator) -> int:
    """One token from ``logits`` (float32 ``[vocab]``) under ``p``."""
    if p.temperature == 0:
        return int(np.argmax(logits))
    x = logits.astype(np.float64) / p.temperature
    if p.top_k and p.top_k < x.size:
        cut = np.partition(x, -p.top_k)[-p.top_k]
        x = np.where(x >= cut, x, -np.inf)
    prob = np.exp(x - x.max())
    prob /= prob.sum()
    if p.top_p < 1:
        order = np.argsort(-prob)
        keep = np.cumsum(prob[order]) - prob[order] < p.top_p  # the smallest set reaching top_p
        mask = np.zeros_like(prob, dtype=bool)
        mask[order[keep]] = True
        prob = np.where(mask, prob, 0)
        prob /= prob.sum()
    return int(rng.choice(prob.size, p=prob))


@dataclasses.dataclass(eq=False)
class GenerationRequest:
    prompt: list[int]
    params: SamplingParams
    emit: Callable[[tuple], None]
    id: int = dataclasses.field(default_factory=itertools.count().__next__)
    submitted: float = dataclasses.field(default_factory=time.perf_counter)
    # filled in by the scheduler
    read: int = 0  # prompt tokens already in the cache
    output: list[int] = dataclasses.field(default_factory=list)
    started: float | None = None  # admitted (queue time ends)
    first_token: float | None = None
    finished: float | None = None
    finish_reason: str | None = None
    cancelled: bool = False
    pages: int = 0
    rng: np.random.Generator | None = None


class Scheduler:
    """Runs :class:`GenerationRequest` s on ``engine``; :meth:`start` it, :meth:`stop` it."""

    def __init__(self, engine, max_queue: int = 64, on_finish: Callable[[GenerationRequest], None] | None = None):
        self.engine = engine
        self.max_queue = int(max_queue)
        self.on_finish = on_finish
        self._waiting: deque[GenerationRequest] = deque()
        self._active: dict[int, GenerationRequest] = {}  # admitted: prefilling or decoding
        self._cv = threading.Condition()
        self._stop = False
        self._thread: threading.Thread | None = None
        self.reserved_pages = 0
        self.steps = {"prefill": 0, "decode": 0}

    # -- requests -----------------------------------------------------------------------------------
    def pages_for(self, n_tokens: int) -> int:
        return math.ceil(n_tokens / self.engine.page_size)

    def submit(self, req: GenerationRequest) -> GenerationRequest:
        ctx = self.engine.context_length
        if not req.prompt:
            raise InputError("the prompt is empty: it must hold at least one token")
        vocab = self.engine.vocab_size
        if any(not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < vocab for t in req.prompt):
            raise InputError(f"the prompt's token ids must be integers in [0, {vocab})")
        if len(req.prompt) >= ctx:
            raise InputError(f"the prompt has {len(req.prompt)} tokens; the context holds {ctx}")
        if len(req.prompt) + req.params.max_tokens > ctx:
            raise InputError(
                f"prompt ({len(req.prompt)} tokens) + max_tokens ({req.params.max_tokens}) exceeds the context "
                f"length {ctx}; lower max_tokens to at most {ctx - len(req.prompt)}"
            )
        req.pages = self.pages_for(len(req.prompt) + req.params.max_tokens)
        if req.pages > self.engine.total_pages:
            raise InputError(f"the request needs {req.pages} KV-cache pages; the cache has {self.engine.total_pages}")
        with self._cv:
            if self._stop:
                raise QueueFull("the scheduler is stopping")
            if len(self._waiting) >= self.max_queue:
                raise QueueFull(f"{len(self._waiting)} requests are waiting (limit {self.max_queue})")
            self._waiting.append(req)
            self._cv.notify()
        return req

    def cancel(self, req: GenerationRequest) -> None:
        """Stop ``req`` (a client went away): its pages return to the pool at the next step."""
        with self._cv:
            req.cancelled = True
            self._cv.notify()

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    @property
    def running(self) -> int:
        return len(self._active)

    def run_until_idle(self) -> None:
        """Step in this thread until every submitted request has finished (no :meth:`start`)."""
        while self._waiting or self._active:
            self.step()

    # -- the loop -----------------------------------------------------------------------------------
    def start(self) -> Scheduler:
        self._thread = threading.Thread(target=self._loop, name="llm-scheduler", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify()
        if self._thread is not None:
            self._thread.join(timeout)

    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._stop and not self._waiting and not self._active:
                    self._cv.wait()
                if self._stop:
                    pending = list(self._waiting) + list(self._active.values())
                    self._waiting.clear()
                    break
            try:
                self.step()
            except Exception as exc:  # the device failed: fail what ran, keep serving
                for req in list(self._active.values()):
                    self._finish(req, None, error=f"{type(exc).__name__}: {exc}")
        for req in pending:
            self._finish(req, "cancelled")

    def _finish(self, req: GenerationRequest, reason: str | None, error: str | None = None) -> None:
        self._active.pop(req.id, None)
        self.engine.remove_sequence(req.id)
        self.reserved_pages -= req.pages if req.started is not None else 0
        req.pages = 0
        req.finished, req.finish_reason = time.perf_counter(), reason or "error"
        req.emit(("error", error) if error else ("done", reason))
        if self.on_finish:
            self.on_finish(req)

    def _admit(self) -> None:
        with self._cv:
            while self._waiting:
                req = self._waiting[0]
                if req.cancelled:
                    self._waiting.popleft()
                    req.finished, req.finish_reason = time.perf_counter(), "cancelled"
                    req.emit(("done", "cancelled"))
                    continue
                fits = self.reserved_pages + req.pages <= self.engine.total_pages
                if len(self._active) >= self.engine.max_sequences or not fits:
                    return
                self._waiting.popleft()
                self.engine.add_sequence(req.id)
                self.reserved_pages += req.pages
                req.started = time.perf_counter()
                req.rng = np.random.default_rng(req.params.seed)
                self._active[req.id] = req

    def _emit_token(self, req: GenerationRequest, logits: np.ndarray | None, token: int | None = None) -> None:
        tok = sample(logits, req.params, req.rng) if token is None else int(token)
        req.output.append(tok)
        if req.first_token is None:
            req.first_token = time.perf_counter()
        req.emit(("token", tok))
        stops = set(req.params.stop_token_ids) | (set() if req.params.ignore_eos else set(self.engine.eos_token_ids))
        if tok in stops:
            self._finish(req, "stop")
        elif len(req.output) >= req.params.max_tokens:
            self._finish(req, "length")

    def step(self) -> None:
        """One scheduling step: admit, one prefill chunk, one decode step."""
        for req in [r for r in self._active.values() if r.cancelled]:
            self._finish(req, "cancelled")
        self._admit()
        budget = self.engine.prefill_chunk
        chunk_ids, chunks = [], []
        for req in self._active.values():
            if req.read < len(req.prompt) and budget > 0:
                take = req.prompt[req.read : req.read + budget]
                chunk_ids.append(req.id)
                chunks.append(take)
                budget -= len(take)
        if chunks:
            logits = self.engine.prefill(chunk_ids, chunks)
            self.steps["prefill"] += 1
            for row, seq, take in zip(logits, chunk_ids, chunks):
                req = self._active[seq]
                req.read += len(take)
                if req.read == len(req.prompt):
                    self._emit_token(req, row)
        decoding = [r for r in self._active.values() if r.read == len(r.prompt) and r.output and r.id not in chunk_ids]
        if decoding:
            seqs, last = [r.id for r in decoding], [r.output[-1] for r in decoding]
            self.steps["decode"] += 1
            if all(r.params.temperature == 0 for r in decoding):  # greedy: argmax where the logits are
                for req, tok in zip(decoding, self.engine.decode_greedy(seqs, last)):
                    if req.id in self._active:
                        self._emit_token(req, None, tok)
                return
            for req, row in zip(decoding, self.engine.decode(seqs, last)):
                if req.id in self._active:
                    self._emit_token(req, row)


def generate(engine, prompts: list[list[int]], params: SamplingParams) -> list[list[int]]:
    """Generate for ``prompts`` together (continuous batching, in this thread); the output token ids."""
    sched = Scheduler(engine, max_queue=max(1, len(prompts)))
    errors: list[str] = []
    reqs = [
        sched.submit(GenerationRequest(list(p), params, lambda ev: errors.append(ev[1]) if ev[0] == "error" else None))
        for p in prompts
    ]
    sched.run_until_idle()
    if errors:
        raise RuntimeError(f"generation failed: {errors[0]}")
    return [r.output for r in reqs]
