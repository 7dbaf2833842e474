"""The HTTP application: the Open Inference Protocol v2 REST API over the model repository, plus
``/metrics`` and ``/openapi.json``. Starlette (ASGI) without pydantic: the request bodies are binary
tensors parsed by :mod:`inferx_edge.serve.protocol`, and the device keeps a small dependency set.

Every error is JSON ``{"error": "..."}``: 400 for a request that breaks the protocol or the model's
signature (the message names the tensor), 404 for an unknown model or version, 503 (with
``Retry-After``) when the queue is full or the server drains, 504 when a request waited past its
timeout, 500 when the device failed the batch it ran in (the server stays up).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import time
from dataclasses import dataclass

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from inferx_edge import __version__
from inferx_edge.errors import InputError
from inferx_edge.serve.batcher import EngineFailure, Overloaded, RequestTimeout, Unavailable
from inferx_edge.serve.metrics import ServerMetrics, size_label
from inferx_edge.serve.protocol import (
    DATATYPES,
    HEADER_LENGTH,
    ProtocolError,
    datatype_name,
    decompress,
    encode_infer_response,
    parse_infer_request,
)
from inferx_edge.serve.repository import Repository
from inferx_edge.serve.shm import SharedMemoryError, SharedMemoryRegistry

#: v2 protocol extensions this server implements (reported by ``GET /v2``)
EXTENSIONS = ["binary_tensor_data", "model_configuration"]


@dataclass
class AppState:
    repository: Repository
    metrics: ServerMetrics
    max_request_bytes: int = 256 << 20
    draining: bool = False
    shm: SharedMemoryRegistry | None = None  # system shared memory (serve --shared-memory)


def _error(status: int, message: str, headers: dict | None = None) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=headers)


def _model_or_404(state: AppState, request: Request):
    name = request.path_params["model"]
    version = request.path_params.get("version")
    mv = state.repository.get(name, version)
    if mv is not None:
        return mv, None
    known = state.repository.get(name)
    if known is None:
        served = ", ".join(sorted(state.repository.models)) or "none"
        return None, _error(404, f"unknown model '{name}'; served models: {served}")
    return None, _error(404, f"model '{name}' has no version '{version}'; served version: {known.version}")


def make_app(state: AppState, auth_token: str | None = None) -> Starlette:
    metrics = state.metrics

    async def live(request):
        return JSONResponse({"live": True})

    async def ready(request):
        ok = not state.draining and all(m.state == "ready" for m in state.repository.models.values())
        return JSONResponse({"ready": ok}, status_code=200 if ok else 503)

    async def server_metadata(request):
        extensions = EXTENSIONS + (["system_shared_memory"] if state.shm is not None else [])
        return JSONResponse({"name": "inferx_edge", "version": __version__, "extensions": extensions})

    async def model_metadata(request):
        mv, err = _model_or_404(state, request)
        if err:
            return err
        sig = mv.signature

        def tensors(specs):
            out = []
            for s in specs:
                dims = [-1 if sig.batchable else s.shape[0]] + [d if d is not None else -1 for d in s.shape[1:]]
                out.append({"name": s.name, "datatype": datatype_name(s.dtype), "shape": dims})
            return out

        return JSONResponse(
            {
                "name": mv.name,
                "versions": [mv.version],
                "platform": f"inferx_edge/{mv.engines[0].manifest.target['name']}",
                "inputs": tensors(sig.inputs),
                "outputs": tensors(sig.outputs),
            }
        )

    async def model_ready(request):
        mv, err = _model_or_404(state, request)
        if err:
            return err
        ok = mv.state == "ready" and not state.draining
        return JSONResponse({"name": mv.name, "ready": ok}, status_code=200 if ok else 503)

    async def model_config(request):
        mv, err = _model_or_404(state, request)
        if err:
            return err
        sig = mv.signature
        max_batch = max(v.batch for e in mv.engines for v in e.manifest.variants) if sig.batchable else 0

        def tensors(specs):
            return [
                {
                    "name": s.name,
                    "data_type": f"TYPE_{datatype_name(s.dtype)}",
                    "dims": [d if d is not None else -1 for d in (s.shape[1:] if sig.batchable else s.shape)],
                }
                for s in specs
            ]

        return JSONResponse(
            {
                "name": mv.name,
                "platform": "inferx_edge",
                "max_batch_size": max_batch,
                "input": tensors(sig.inputs),
                "output": tensors(sig.outputs),
                "dynamic_batching": {
                    "max_queue_delay_microseconds": int(mv.options.batch.max_queue_delay_s * 1e6),
                },
                "instance_group": [
                    {"kind": "KIND_GPU" if s.label.startswith("cuda") else "KIND_CPU"} for s in mv.slots
                ],
                "parameters": {
                    "governor_policy": {"string_value": mv.governor.policy_name},
                    "operating_points": {"string_value": ",".join(mv.governor.points)},
                },
            }
        )

    async def infer(request):
        t0 = time.monotonic()
        mv, err = _model_or_404(state, request)
        if err:
            return err
        labels = mv.labels

        def fail(status: int, message: str, reason: str, headers=None):
            metrics.add("nv_inference_request_failure", (*labels, reason))
            return _error(status, message, headers)

        if state.draining:
            return fail(503, "server is shutting down; retry on another replica", "REJECTED", {"Retry-After": "1"})
        if mv.batcher.depth >= mv.options.batch.max_queue_size:  # refuse before reading a large body
            return fail(503, f"queue full ({mv.batcher.depth} requests waiting)", "REJECTED", {"Retry-After": "1"})
        limit = state.max_request_bytes
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            return fail(
                400, f"payload of {declared} bytes is over the limit of {limit} bytes (--max-request-bytes)", "REJECTED"
            )
        chunks, size = [], 0
        try:
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    return fail(400, f"payload is over the limit of {limit} bytes (--max-request-bytes)", "REJECTED")
                chunks.append(chunk)
        except ClientDisconnect:
            return fail(400, "client disconnected while sending the request", "CANCELED")
        body = b"".join(chunks)
        loop = asyncio.get_running_loop()
        fut = loop.create_future()

        def on_done(r):
            try:
                loop.call_soon_threadsafe(lambda: fut.done() or fut.set_result(r))
            except RuntimeError:  # the event loop is gone (server stopped): nobody waits for it
                pass

        def decode():
            raw = decompress(body, request.headers.get("content-encoding"), limit)
            req = parse_infer_request(raw, request.headers.get(HEADER_LENGTH.lower()), state.shm)
            check_outputs(req, mv)
            return req

        def check_outputs(req, version):
            names = {s.name for s in version.signature.outputs}
            for o in req.outputs or []:
                if o.name not in names:
                    raise ProtocolError(f"unknown output '{o.name}'; the model's outputs: {', '.join(sorted(names))}")

        try:
            # large tensors (a big body, or shared memory) are decoded and checked for NaN off the event
            # loop: a 38 MB batch takes milliseconds that other connections would wait for
            parsed = await run_in_threadpool(decode) if len(body) > 1 << 20 else decode()
            big = sum(a.nbytes for a in parsed.inputs.values()) > 1 << 20
            while True:
                try:
                    pending = (
                        await run_in_threadpool(mv.submit, parsed.inputs, on_done)
                        if big
                        else mv.submit(parsed.inputs, on_done)
                    )
                    break
                except Unavailable:
                    # a hot reload swapped versions while this request was being read: the version it
                    # resolved to drains (it finishes what it accepted, takes nothing new), so a request
                    # that named no version goes to the version now served instead of failing
                    current = None if "version" in request.path_params else state.repository.get(mv.name)
                    if current is None or current is mv:
                        raise
                    mv, labels = current, current.labels
                    check_outputs(parsed, mv)
        except (ProtocolError, ValueError, InputError) as exc:
            return fail(400, str(exc), "REJECTED")
        except Overloaded as exc:
            return fail(503, str(exc), "REJECTED", {"Retry-After": str(max(1, round(exc.retry_after_s)))})
        except Unavailable as exc:
            return fail(503, str(exc), "REJECTED", {"Retry-After": "1"})
        try:
            done = await asyncio.wait_for(asyncio.shield(fut), mv.options.batch.timeout_s)
        except asyncio.TimeoutError:
            pending.cancelled = True
            return fail(
                504, f"request not answered within {mv.options.batch.timeout_s:g} s (--request-timeout-s)", "CANCELED"
            )
        if done.error is not None:
            e = done.error
            if isinstance(e, RequestTimeout):
                return fail(504, str(e), "CANCELED")
            if isinstance(e, Unavailable):
                return fail(503, str(e), "REJECTED", {"Retry-After": "1"})
            status = 500 if isinstance(e, EngineFailure) else 500
            return fail(status, str(e), "BACKEND")
        outputs = {s.name: a for s, a in zip(mv.signature.outputs, done.outputs)}
        try:
            payload, header_len = encode_infer_response(mv.name, mv.version, parsed, outputs, state.shm)
        except ProtocolError as exc:
            return fail(400, str(exc), "REJECTED")
        headers = {HEADER_LENGTH: str(header_len)} if header_len is not None else None
        media = "application/octet-stream" if header_len is not None else "application/json"
        total = time.monotonic() - t0
        queue_s = max((done.started or t0) - done.arrival, 0.0)
        metrics.add("nv_inference_request_success", labels)
        metrics.add("nv_inference_count", labels, done.rows)
        metrics.add("nv_inference_request_duration_us", labels, total * 1e6)
        metrics.add("nv_inference_queue_duration_us", labels, queue_s * 1e6)
        metrics.add("nv_inference_compute_infer_duration_us", labels, done.compute_s * 1e6)
        metrics.latency.labels(*labels, size_label(done.rows)).observe(total)
        mv.governor.observe_request(total, done.rows)
        return Response(payload, media_type=media, headers=headers)

    def _shm_or_error(request):
        if state.shm is None:
            return _error(400, "system shared memory is not enabled on this server (serve --shared-memory)")
        host = request.client.host if request.client else ""
        if not is_loopback(host):
            return _error(403, f"shared memory is for clients on this host; {host} is not")
        return None

    async def shm_register(request):
        err = _shm_or_error(request)
        if err:
            return err
        try:
            doc = json.loads(await request.body())
            if not isinstance(doc, dict):
                raise ValueError("expected a JSON object")
        except ValueError as exc:
            return _error(400, f'register body must be {{"key", "offset", "byte_size"}} JSON ({exc})')
        try:
            state.shm.register(
                request.path_params["region"], doc.get("key"), doc.get("offset", 0), doc.get("byte_size")
            )
        except SharedMemoryError as exc:
            return _error(400, str(exc))
        return JSONResponse({})

    async def shm_unregister(request):
        err = _shm_or_error(request)
        if err:
            return err
        try:
            state.shm.unregister(request.path_params.get("region"))
        except SharedMemoryError as exc:
            return _error(400, str(exc))
        return JSONResponse({})

    async def shm_status(request):
        err = _shm_or_error(request)
        if err:
            return err
        try:
            return JSONResponse(state.shm.status(request.path_params.get("region")))
        except SharedMemoryError as exc:
            return _error(400, str(exc))

    async def prometheus(request):
        for m in state.repository.models.values():
            metrics.set("inferx_queue_depth", m.labels, m.batcher.depth)
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    async def openapi(request):
        from inferx_edge.serve.openapi import openapi_document

        return JSONResponse(openapi_document())

    handlers = {
        "live": live,
        "ready": ready,
        "server_metadata": server_metadata,
        "model_metadata": model_metadata,
        "model_ready": model_ready,
        "model_config": model_config,
        "infer": infer,
        "metrics": prometheus,
        "openapi": openapi,
        "shm_register": shm_register,
        "shm_unregister": shm_unregister,
        "shm_status": shm_status,
    }
    from inferx_edge.serve.openapi import ROUTES

    routes = [Route(r.path, handlers[r.handler], methods=[r.method]) for r in ROUTES]

    async def http_error(request, exc: HTTPException):
        return _error(exc.status_code, f"{exc.detail}: {request.method} {request.url.path}")

    async def unexpected(request, exc: Exception):
        return _error(500, f"internal error: {type(exc).__name__}: {exc}")

    app = Starlette(routes=routes, exception_handlers={HTTPException: http_error, Exception: unexpected})
    if auth_token:
        return BearerAuth(app, auth_token)
    return app


class BearerAuth:
    """ASGI middleware: every path but ``/v2/health/*`` (Kubernetes probes) needs
    ``Authorization: Bearer <token>``; compared in constant time."""

    def __init__(self, app, token: str) -> None:
        self.app = app
        self.expected = f"Bearer {token}".encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and not scope["path"].startswith("/v2/health/"):
            got = dict(scope.get("headers", [])).get(b"authorization", b"")
            if not hmac.compare_digest(got, self.expected):
                body = json.dumps({"error": "missing or wrong bearer token (Authorization: Bearer ...)"}).encode()
                await send(
                    {
                        "type": "http.response.start",
                        "status": 401,
                        "headers": [
                            (b"content-type", b"application/json"),
                            (b"www-authenticate", b"Bearer"),
                            (b"content-length", str(len(body)).encode()),
                        ],
                    }
                )
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or an address) is this machine."""
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


__all__ = ["AppState", "make_app", "EXTENSIONS", "DATATYPES"]
