"""The server's routes in one table, and the OpenAPI document built from it (committed as
``docs/openapi.json``; a test fails when the served document and the committed one differ).

``x-stability``: ``stable`` paths follow the Open Inference Protocol v2 (or Prometheus) and change only
with it; ``preview`` paths are inferx_edge's or Triton's extensions and may change between releases.
"""

from __future__ import annotations

from dataclasses import dataclass

from inferx_edge import __version__


@dataclass(frozen=True)
class RouteSpec:
    method: str
    path: str
    handler: str
    stability: str
    summary: str
    responses: tuple[int, ...] = (200,)


_M = "/v2/models/{model}"
_V = "/v2/models/{model}/versions/{version}"
_SHM = "/v2/systemsharedmemory/region/{region}"

ROUTES = (
    RouteSpec("GET", "/v2/health/live", "live", "stable", "Server liveness"),
    RouteSpec(
        "GET", "/v2/health/ready", "ready", "stable", "Server readiness (every model loaded, not draining)", (200, 503)
    ),
    RouteSpec("GET", "/v2", "server_metadata", "stable", "Server metadata and protocol extensions"),
    RouteSpec("GET", _M, "model_metadata", "stable", "Model metadata: versions, inputs, outputs", (200, 404)),
    RouteSpec("GET", _V, "model_metadata", "stable", "Model metadata of one version", (200, 404)),
    RouteSpec("GET", f"{_M}/ready", "model_ready", "stable", "Model readiness", (200, 404, 503)),
    RouteSpec("GET", f"{_V}/ready", "model_ready", "stable", "Model version readiness", (200, 404, 503)),
    RouteSpec(
        "POST", f"{_M}/infer", "infer", "stable", "Inference (JSON or binary tensors)", (200, 400, 404, 500, 503, 504)
    ),
    RouteSpec("POST", f"{_V}/infer", "infer", "stable", "Inference on one version", (200, 400, 404, 500, 503, 504)),
    RouteSpec("GET", f"{_M}/config", "model_config", "preview", "Triton-style model configuration", (200, 404)),
    RouteSpec(
        "GET", f"{_V}/config", "model_config", "preview", "Triton-style model configuration of one version", (200, 404)
    ),
    RouteSpec("GET", "/metrics", "metrics", "stable", "Prometheus metrics (Triton names plus inferx_*)"),
    RouteSpec("GET", "/openapi.json", "openapi", "preview", "This document"),
    RouteSpec(
        "GET",
        "/v2/systemsharedmemory/status",
        "shm_status",
        "preview",
        "Registered shared memory regions",
        (200, 400, 403),
    ),
    RouteSpec("GET", f"{_SHM}/status", "shm_status", "preview", "One shared memory region", (200, 400, 403)),
    RouteSpec(
        "POST",
        f"{_SHM}/register",
        "shm_register",
        "preview",
        "Register a POSIX shared memory region (serve --shared-memory)",
        (200, 400, 403),
    ),
    RouteSpec(
        "POST", f"{_SHM}/unregister", "shm_unregister", "preview", "Unregister a shared memory region", (200, 400, 403)
    ),
    RouteSpec(
        "POST",
        "/v2/systemsharedmemory/unregister",
        "shm_unregister",
        "preview",
        "Unregister every shared memory region",
        (200, 400, 403),
    ),
)

_ERROR = {"type": "object", "properties": {"error": {"type": "string"}}, "required": ["error"]}
_TENSOR = {
    "type": "object",
    "required": ["name", "shape", "datatype"],
    "properties": {
        "name": {"type": "string"},
        "shape": {"type": "array", "items": {"type": "integer"}},
        "datatype": {"type": "string"},
        "parameters": {"type": "object", "properties": {"binary_data_size": {"type": "integer"}}},
        "data": {"type": "array"},
    },
}
_INFER_REQUEST = {
    "type": "object",
    "required": ["inputs"],
    "properties": {
        "id": {"type": "string"},
        "parameters": {"type": "object", "properties": {"binary_data_output": {"type": "boolean"}}},
        "inputs": {"type": "array", "items": {"$ref": "#/components/schemas/Tensor"}},
        "outputs": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"name": {"type": "string"}, "parameters": {"type": "object"}},
            },
        },
    },
}
_DESCRIPTIONS = {
    200: "OK",
    400: "Malformed request, or tensors that do not match the model",
    403: "Shared memory asked for by a client on another host",
    404: "Unknown model or version",
    500: "The device failed the batch the request ran in",
    503: "Not ready, draining, or the queue is full (Retry-After)",
    504: "The request waited past its timeout",
}


def openapi_document() -> dict:
    paths: dict[str, dict] = {}
    for r in ROUTES:
        op = {
            "summary": r.summary,
            "operationId": f"{r.handler}_{r.method.lower()}_{r.path.count('/')}{'_v' if '{version}' in r.path else ''}",
            "x-stability": r.stability,
            "responses": {
                str(code): {
                    "description": _DESCRIPTIONS[code],
                    **(
                        {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
                        if code >= 400
                        else {}
                    ),
                }
                for code in r.responses
            },
        }
        params = [name for name in ("model", "version", "region") if "{" + name + "}" in r.path]
        if params:
            op["parameters"] = [
                {"name": n, "in": "path", "required": True, "schema": {"type": "string"}} for n in params
            ]
        if r.handler == "infer":
            op["requestBody"] = {
                "required": True,
                "description": "JSON, or a JSON header of Inference-Header-Content-Length bytes followed by binary tensor data",
                "content": {
                    "application/json": {"schema": {"$ref": "#/components/schemas/InferRequest"}},
                    "application/octet-stream": {"schema": {"type": "string", "format": "binary"}},
                },
            }
        paths.setdefault(r.path, {})[r.method.lower()] = op
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "inferx_edge inference server",
            "version": __version__,
            "description": "Open Inference Protocol v2 (KServe v2) REST API with the binary tensor data extension",
        },
        "paths": paths,
        "components": {"schemas": {"Error": _ERROR, "Tensor": _TENSOR, "InferRequest": _INFER_REQUEST}},
    }
