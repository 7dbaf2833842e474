"""Text generation over HTTP: OpenAI ``/v1/completions`` and ``/v1/chat/completions`` (``stream: true``
as server-sent events) and Triton's ``generate`` / ``generate_stream`` on the v2 paths, over one
:class:`~inferx_edge.runtime.llm_scheduler.Scheduler` (continuous batching).

Errors are JSON ``{"error": ...}``: 400 for a malformed body or invalid parameter (the message names
it), 404 for another model's name, 503 with ``Retry-After`` when the waiting queue is full. A client
that disconnects mid-stream cancels its request; its KV-cache pages return to the pool at the next
scheduler step.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from inferx_edge.errors import InputError
from inferx_edge.runtime.llm import TextStream
from inferx_edge.runtime.llm_scheduler import GenerationRequest, QueueFull, SamplingParams, Scheduler
from inferx_edge.serve.app import BearerAuth, _error

_SAMPLING_KEYS = ("max_tokens", "temperature", "top_p", "top_k", "seed", "ignore_eos")
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


class LLMMetrics:
    def __init__(self, model: str) -> None:
        self.registry = r = CollectorRegistry()
        self.labels = {"model": model}
        lab = ["model"]
        self.requests = Counter("inferx_llm_requests", "generation requests by outcome", [*lab, "outcome"], registry=r)
        self.tokens = Counter("inferx_llm_generated_tokens", "tokens generated", lab, registry=r)
        self.prompt_tokens = Counter("inferx_llm_prompt_tokens", "prompt tokens read", lab, registry=r)
        self.ttft = Histogram("inferx_llm_time_to_first_token_seconds", "submit to first token", lab, buckets=_LATENCY_BUCKETS, registry=r)  # fmt: skip
        self.tpot = Histogram("inferx_llm_time_per_output_token_seconds", "mean gap between output tokens", lab, buckets=_LATENCY_BUCKETS, registry=r)  # fmt: skip
        self.queue = Histogram("inferx_llm_queue_seconds", "submit to admission", lab, buckets=_LATENCY_BUCKETS, registry=r)  # fmt: skip
        self.pages_used = Gauge("inferx_llm_kv_pages_used", "KV-cache pages reserved by running sequences", lab, registry=r)  # fmt: skip
        self.pages_free = Gauge("inferx_llm_kv_pages_free", "KV-cache pages not reserved", lab, registry=r)
        self.running = Gauge("inferx_llm_sequences_running", "sequences in the KV cache", lab, registry=r)
        self.waiting = Gauge("inferx_llm_requests_waiting", "requests waiting for admission", lab, registry=r)
        self.tokens_per_s = Gauge("inferx_llm_tokens_per_second", "generated tokens/s over the last 10 s", lab, registry=r)  # fmt: skip
        self._recent: list[tuple[float, int]] = []

    def finished(self, req: GenerationRequest) -> None:
        lab = self.labels
        self.requests.labels(**lab, outcome=req.finish_reason or "error").inc()
        self.tokens.labels(**lab).inc(len(req.output))
        self.prompt_tokens.labels(**lab).inc(len(req.prompt))
        if req.started is not None:
            self.queue.labels(**lab).observe(req.started - req.submitted)
        if req.first_token is not None:
            self.ttft.labels(**lab).observe(req.first_token - req.submitted)
            if len(req.output) > 1 and req.finished:
                self.tpot.labels(**lab).observe((req.finished - req.first_token) / (len(req.output) - 1))
        now = time.monotonic()
        self._recent = [(t, n) for t, n in self._recent if now - t < 10] + [(now, len(req.output))]

    def refresh(self, sched: Scheduler) -> None:
        lab = self.labels
        self.pages_used.labels(**lab).set(sched.reserved_pages)
        self.pages_free.labels(**lab).set(sched.engine.total_pages - sched.reserved_pages)
        self.running.labels(**lab).set(sched.running)
        self.waiting.labels(**lab).set(sched.waiting)
        now = time.monotonic()
        self.tokens_per_s.labels(**lab).set(sum(n for t, n in self._recent if now - t < 10) / 10)


class EngineError(Exception):
    """The device failed a step this request was in (answered 500; the server keeps serving)."""


def _sampling(body: dict[str, Any], stop_ids: tuple[int, ...] = ()) -> SamplingParams:
    kwargs = {k: body[k] for k in _SAMPLING_KEYS if k in body and body[k] is not None}
    if "max_completion_tokens" in body and "max_tokens" not in kwargs:
        kwargs["max_tokens"] = body["max_completion_tokens"]
    return SamplingParams(**kwargs, stop_token_ids=stop_ids)


def _stops(body: dict[str, Any]) -> list[str]:
    stop = body.get("stop")
    if stop is None:
        return []
    stop = [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop) or len(stop) > 4:
        raise InputError("'stop' must be a non-empty string or a list of at most 4 of them")
    return stop


class LLMService:
    """One served LLM: the engine, its scheduler and metrics."""

    def __init__(self, engine, name: str, max_queue: int = 64) -> None:
        self.engine, self.name = engine, name
        self.metrics = LLMMetrics(name)
        self.scheduler = Scheduler(engine, max_queue=max_queue, on_finish=self.metrics.finished).start()

    def close(self) -> None:
        self.scheduler.stop()

    def submit(self, prompt_ids: list[int], params: SamplingParams) -> tuple[GenerationRequest, asyncio.Queue]:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        req = GenerationRequest(prompt_ids, params, lambda ev: loop.call_soon_threadsafe(queue.put_nowait, ev))
        return self.scheduler.submit(req), queue

    async def events(self, req: GenerationRequest, queue: asyncio.Queue, request: Request, stops: list[str]):
        """``(delta_text, finish_reason)`` pairs until the request finishes; cancels it when the client
        disconnects or a stop string appears."""
        stream, pending = TextStream(self.engine.tokenizer), ""  # pending: text held back from the client
        try:
            while True:
                try:
                    ev = await asyncio.wait_for(queue.get(), timeout=0.5)
                except asyncio.TimeoutError:
                    if await request.is_disconnected():
                        self.scheduler.cancel(req)
                        return
                    continue
                if ev[0] == "error":
                    raise EngineError(ev[1])
                done = ev[0] == "done"
                pending += stream.flush() if done else stream.push(ev[1])
                hits = [i for i in (pending.find(s) for s in stops) if i >= 0]
                if hits:
                    self.scheduler.cancel(req)
                    yield pending[: min(hits)], "stop"
                    return
                # a suffix that may begin a stop string waits for the next token
                keep = max((k for s in stops for k in range(len(s) - 1, 0, -1) if pending.endswith(s[:k])), default=0)
                if done:
                    yield pending, ("stop" if ev[1] == "cancelled" else ev[1])
                    return
                if len(pending) > keep:
                    yield pending[: len(pending) - keep], None
                    pending = pending[len(pending) - keep :]
        finally:
            if req.finished is None:
                self.scheduler.cancel(req)


def make_llm_app(service: LLMService, auth_token: str | None = None) -> Starlette:
    engine = service.engine

    async def parse(request: Request) -> dict[str, Any]:
        try:
            body = json.loads(await request.body())
        except (ValueError, UnicodeDecodeError) as exc:
            raise InputError(f"the request body is not valid JSON: {exc}") from exc
        if not isinstance(body, dict):
            raise InputError("the request body must be a JSON object")
        model = body.get("model")
        if model not in (None, "", service.name):
            raise LookupError(f"unknown model '{model}'; served model: {service.name}")
        return body

    def prompt_ids(prompt: Any) -> list[int]:
        if isinstance(prompt, str):
            return engine.encode(prompt)
        if isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            return list(prompt)
        raise InputError("'prompt' must be a string or a list of token ids (one prompt per request)")

    def guarded(handler):
        async def run(request: Request):
            try:
                return await handler(request)
            except InputError as exc:
                service.metrics.requests.labels(**service.metrics.labels, outcome="rejected").inc()
                return _error(400, str(exc))
            except LookupError as exc:
                return _error(404, str(exc))
            except QueueFull as exc:
                service.metrics.requests.labels(**service.metrics.labels, outcome="overloaded").inc()
                return _error(503, f"server overloaded: {exc}", {"Retry-After": "1"})

        return run

    async def generate(request: Request, ids: list[int], body: dict[str, Any], shape) -> Response:
        params = _sampling(body)
        stops = _stops(body)
        req, queue = service.submit(ids, params)
        rid = f"{shape.prefix}-{uuid.uuid4().hex[:16]}"
        if body.get("stream"):

            async def sse():
                try:
                    async for delta, reason in service.events(req, queue, request, stops):
                        yield f"data: {json.dumps(shape.chunk(rid, delta, reason, service.name))}\n\n"
                except EngineError as exc:
                    yield f"data: {json.dumps({'error': f'generation failed: {exc}'})}\n\n"
                if shape.done_marker:
                    yield "data: [DONE]\n\n"

            return StreamingResponse(sse(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        text, reason = "", None
        try:
            async for delta, r in service.events(req, queue, request, stops):
                text, reason = text + delta, r or reason
        except EngineError as exc:
            return _error(500, f"generation failed: {exc}")
        usage = {
            "prompt_tokens": len(ids),
            "completion_tokens": len(req.output),
            "total_tokens": len(ids) + len(req.output),
        }
        return JSONResponse(shape.whole(rid, text, reason, service.name, usage))

    @guarded
    async def completions(request: Request):
        body = await parse(request)
        if "prompt" not in body:
            raise InputError("'prompt' is required")
        return await generate(request, prompt_ids(body["prompt"]), body, _Completion)

    @guarded
    async def chat(request: Request):
        body = await parse(request)
        ids = engine.encode(engine.render_chat(body.get("messages")))
        return await generate(request, ids, body, _Chat)

    @guarded
    async def triton_generate(request: Request):
        body = await parse(request)
        if request.path_params["model"] != service.name:
            raise LookupError(f"unknown model '{request.path_params['model']}'; served model: {service.name}")
        text = body.get("text_input")
        if not isinstance(text, str):
            raise InputError("'text_input' (a string) is required")
        params = body.get("parameters") or {}
        if not isinstance(params, dict):
            raise InputError("'parameters' must be an object")
        params = dict(params, stream=request.url.path.endswith("_stream"))
        return await generate(request, prompt_ids(text), params, _Triton)

    async def models(request: Request):
        return JSONResponse(
            {"object": "list", "data": [{"id": service.name, "object": "model", "owned_by": "inferx_edge"}]}
        )

    async def live(request: Request):
        return JSONResponse({"live": True})

    async def prometheus(request: Request):
        service.metrics.refresh(service.scheduler)
        return Response(generate_latest(service.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    routes = [
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/v2/models/{model}/generate", triton_generate, methods=["POST"]),
        Route("/v2/models/{model}/generate_stream", triton_generate, methods=["POST"]),
        Route("/v2/health/live", live, methods=["GET"]),
        Route("/v2/health/ready", live, methods=["GET"]),
        Route("/metrics", prometheus, methods=["GET"]),
    ]
    app = Starlette(routes=routes)
    if auth_token:
        return BearerAuth(app, auth_token)
    return app


class _Completion:
    prefix, done_marker = "cmpl", True

    @staticmethod
    def chunk(rid, delta, reason, model):
        choice = {"index": 0, "text": delta, "finish_reason": reason, "logprobs": None}
        return {
            "id": rid,
            "object": "text_completion",
            "created": int(time.time()),
            "model": model,
            "choices": [choice],
        }

    @staticmethod
    def whole(rid, text, reason, model, usage):
        return _Completion.chunk(rid, text, reason, model) | {"usage": usage}


class _Chat:
    prefix, done_marker = "chatcmpl", True

    @staticmethod
    def chunk(rid, delta, reason, model):
        choice = {"index": 0, "delta": {"role": "assistant", "content": delta}, "finish_reason": reason}
        return {"id": rid, "object": "chat.completion.chunk", "created": int(time.time()), "model": model, "choices": [choice]}  # fmt: skip

    @staticmethod
    def whole(rid, text, reason, model, usage):
        choice = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": reason}
        return {"id": rid, "object": "chat.completion", "created": int(time.time()), "model": model, "choices": [choice], "usage": usage}  # fmt: skip


class _Triton:
    prefix, done_marker = "gen", False

    @staticmethod
    def chunk(rid, delta, reason, model):
        return {"id": rid, "model_name": model, "text_output": delta, "finish_reason": reason}

    @staticmethod
    def whole(rid, text, reason, model, usage):
        return {"id": rid, "model_name": model, "text_output": text, "finish_reason": reason, "usage": usage}
