"""The Open Inference Protocol v2 (KServe v2) wire format: JSON tensors and the binary tensor data
extension, decoded into numpy arrays and encoded back. Pure functions: no server, no runtime.

Binary extension: the request body is a JSON header of ``Inference-Header-Content-Length`` bytes
followed by the raw little-endian bytes of every input whose ``parameters.binary_data_size`` is set, in
the order of ``inputs``. Outputs are sent binary when the request asks (``binary_data_output`` for all,
or ``parameters.binary_data`` per requested output); the response then carries the same header.
"""

from __future__ import annotations

import json
import math
import zlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np

#: v2 datatype -> numpy dtype (BYTES, strings, has no fixed-size numpy form and is not served)
DATATYPES: dict[str, np.dtype] = {
    "BOOL": np.dtype("bool"),
    "UINT8": np.dtype("uint8"),
    "UINT16": np.dtype("<u2"),
    "UINT32": np.dtype("<u4"),
    "UINT64": np.dtype("<u8"),
    "INT8": np.dtype("int8"),
    "INT16": np.dtype("<i2"),
    "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"),
    "FP16": np.dtype("<f2"),
    "FP32": np.dtype("<f4"),
    "FP64": np.dtype("<f8"),
}
_BY_NUMPY = {np.dtype(v).newbyteorder("=").str: k for k, v in DATATYPES.items()}

HEADER_LENGTH = "Inference-Header-Content-Length"


class ProtocolError(ValueError):
    """A request that does not follow the protocol; the message names the tensor and the problem."""


def datatype_of(dtype) -> str:
    """The v2 datatype name of a numpy dtype (``float32`` -> ``FP32``)."""
    key = np.dtype(dtype).newbyteorder("=").str
    if key not in _BY_NUMPY:
        raise ProtocolError(f"dtype {np.dtype(dtype)} has no v2 datatype")
    return _BY_NUMPY[key]


def datatype_name(dtype) -> str:
    """``datatype_of`` for messages and metadata: a dtype without a v2 datatype keeps its own name."""
    try:
        return datatype_of(dtype)
    except ProtocolError:
        return str(dtype).upper()


@dataclass
class RequestedOutput:
    name: str
    binary: bool
    shm: tuple[str, int, int] | None = None  # (region, offset, byte_size): written there, not sent


@dataclass
class InferRequest:
    """A decoded ``/infer`` body."""

    id: str | None
    inputs: dict[str, np.ndarray]
    outputs: list[RequestedOutput] | None  # None: all outputs
    binary_output: bool
    parameters: dict[str, Any] = field(default_factory=dict)


def decompress(body: bytes, encoding: str | None, limit: int) -> bytes:
    """Undo ``Content-Encoding: gzip|deflate`` (Triton's client compresses on request), never
    producing more than ``limit`` bytes (a small bomb must not fill memory)."""
    if not encoding or encoding == "identity":
        return body
    if encoding not in ("gzip", "deflate"):
        raise ProtocolError(f"unsupported Content-Encoding '{encoding}'; valid: gzip, deflate, identity")
    d = zlib.decompressobj(wbits=31 if encoding == "gzip" else 15)
    try:
        out = d.decompress(body, limit + 1)
    except zlib.error as exc:
        raise ProtocolError(f"body is not valid {encoding} data ({exc})") from exc
    if len(out) > limit:
        raise ProtocolError(f"decompressed body exceeds the request size limit of {limit} bytes")
    return out


def _shape(name: str, raw) -> tuple[int, ...]:
    if not isinstance(raw, list) or not all(isinstance(d, int) and not isinstance(d, bool) for d in raw):
        raise ProtocolError(f"input '{name}': 'shape' must be a list of integers, got {raw!r}")
    if any(d < 0 for d in raw):
        raise ProtocolError(f"input '{name}': shape {raw} has a negative dimension")
    return tuple(raw)


def _from_json_data(name: str, data, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    count = math.prod(shape)
    try:
        arr = np.asarray(data)
    except (ValueError, TypeError) as exc:  # ragged nesting
        raise ProtocolError(f"input '{name}': 'data' is not a regular (nested) list of numbers ({exc})") from exc
    if arr.dtype.kind not in "biuf":
        raise ProtocolError(f"input '{name}': 'data' must hold numbers, got {arr.dtype} values")
    if arr.size != count:
        raise ProtocolError(f"input '{name}': 'data' holds {arr.size} elements, shape {list(shape)} needs {count}")
    if dtype.kind in "iub" and arr.dtype.kind == "f":
        raise ProtocolError(f"input '{name}': {datatype_of(dtype)} data must be integers")
    if dtype.kind in "iu" and arr.size:
        info = np.iinfo(dtype)
        if arr.min() < info.min or arr.max() > info.max:
            raise ProtocolError(f"input '{name}': a value is out of range for {datatype_of(dtype)}")
    return arr.reshape(-1).astype(dtype).reshape(shape)


def _shm_input(name: str, tparams: dict, dtype: np.dtype, shape: tuple[int, ...], shm) -> np.ndarray:
    if shm is None:
        raise ProtocolError(
            f"input '{name}' uses shared memory, which this server does not enable (serve --shared-memory)"
        )
    size = tparams.get("shared_memory_byte_size")
    want = math.prod(shape) * dtype.itemsize
    if size != want:
        raise ProtocolError(
            f"input '{name}': shared_memory_byte_size {size!r} does not match {list(shape)} ({want} bytes)"
        )
    try:
        view = shm.view(tparams["shared_memory_region"], tparams.get("shared_memory_offset", 0), size)
    except ValueError as exc:
        raise ProtocolError(f"input '{name}': {exc}") from exc
    return np.frombuffer(view, dtype=dtype).reshape(shape)


def parse_infer_request(body: bytes, header_length: str | int | None, shm=None) -> InferRequest:
    """Decode an ``/infer`` body (JSON only, or JSON header + binary tensor data); ``shm`` resolves
    shared-memory tensors (a :class:`~inferx_edge.serve.shm.SharedMemoryRegistry`, None: refused)."""
    if header_length is not None:
        try:
            hl = int(header_length)
        except (TypeError, ValueError):
            raise ProtocolError(f"{HEADER_LENGTH} must be an integer, got {header_length!r}") from None
        if not 0 <= hl <= len(body):
            raise ProtocolError(f"{HEADER_LENGTH} {hl} is outside the body of {len(body)} bytes")
        head, binary = body[:hl], memoryview(body)[hl:]
    else:
        head, binary = body, memoryview(b"")
    try:
        doc = json.loads(head)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ProtocolError(f"request body is not valid JSON ({exc})") from exc
    if not isinstance(doc, dict):
        raise ProtocolError("request body must be a JSON object with an 'inputs' list")
    inputs_doc = doc.get("inputs")
    if not isinstance(inputs_doc, list) or not inputs_doc:
        raise ProtocolError("request needs a non-empty 'inputs' list")
    params = doc.get("parameters") or {}
    if not isinstance(params, dict):
        raise ProtocolError("'parameters' must be a JSON object")
    inputs: dict[str, np.ndarray] = {}
    offset = 0
    for i, t in enumerate(inputs_doc):
        if not isinstance(t, dict) or not isinstance(t.get("name"), str):
            raise ProtocolError(f"inputs[{i}] must be an object with a string 'name'")
        name = t["name"]
        if name in inputs:
            raise ProtocolError(f"input '{name}' is given twice")
        datatype = t.get("datatype")
        if not isinstance(datatype, str) or datatype not in DATATYPES:
            raise ProtocolError(
                f"input '{name}': datatype {datatype!r} is not supported; valid: {', '.join(DATATYPES)}"
            )
        dtype = DATATYPES[datatype]
        shape = _shape(name, t.get("shape"))
        tparams = t.get("parameters") or {}
        if not isinstance(tparams, dict):
            raise ProtocolError(f"input '{name}': 'parameters' must be a JSON object")
        size = tparams.get("binary_data_size")
        if "shared_memory_region" in tparams:
            arr = _shm_input(name, tparams, dtype, shape, shm)
        elif size is not None:
            if "data" in t:
                raise ProtocolError(f"input '{name}' has both 'data' and binary_data_size")
            if not isinstance(size, int) or isinstance(size, bool) or size < 0:
                raise ProtocolError(f"input '{name}': binary_data_size must be a non-negative integer")
            want = math.prod(shape) * dtype.itemsize
            if size != want:
                raise ProtocolError(
                    f"input '{name}': binary_data_size {size} does not match {datatype}{list(shape)} ({want} bytes)"
                )
            if offset + size > len(binary):
                raise ProtocolError(
                    f"input '{name}': binary data ends after {len(binary) - offset} of its {size} bytes"
                )
            arr = np.frombuffer(binary[offset : offset + size], dtype=dtype).reshape(shape)
            offset += size
        else:
            if "data" not in t:
                raise ProtocolError(f"input '{name}' has neither 'data' nor parameters.binary_data_size")
            arr = _from_json_data(name, t["data"], dtype, shape)
        inputs[name] = arr
    if offset != len(binary):
        raise ProtocolError(f"{len(binary) - offset} bytes of binary data follow the last binary input")
    outputs = None
    if doc.get("outputs") is not None:
        if not isinstance(doc["outputs"], list):
            raise ProtocolError("'outputs' must be a list")
        outputs = []
        for i, o in enumerate(doc["outputs"]):
            if not isinstance(o, dict) or not isinstance(o.get("name"), str):
                raise ProtocolError(f"outputs[{i}] must be an object with a string 'name'")
            op = o.get("parameters") or {}
            if not isinstance(op, dict):
                raise ProtocolError(f"output '{o['name']}': 'parameters' must be a JSON object")
            region = None
            if "shared_memory_region" in op:
                if shm is None:
                    raise ProtocolError(f"output '{o['name']}' uses shared memory, which this server does not enable")
                region = (
                    op["shared_memory_region"],
                    op.get("shared_memory_offset", 0),
                    op.get("shared_memory_byte_size"),
                )
                if not isinstance(region[2], int) or isinstance(region[2], bool) or region[2] <= 0:
                    raise ProtocolError(f"output '{o['name']}': shared_memory_byte_size must be a positive integer")
            binary = bool(op.get("binary_data", params.get("binary_data_output")))
            outputs.append(RequestedOutput(o["name"], binary, region))
    rid = doc.get("id")
    if rid is not None and not isinstance(rid, str):
        raise ProtocolError("'id' must be a string")
    return InferRequest(rid, inputs, outputs, bool(params.get("binary_data_output", False)), params)


def encode_infer_response(
    model: str, version: str, request: InferRequest, outputs: dict[str, np.ndarray], shm=None
) -> tuple[bytes, int | None]:
    """The response body and, when any output is binary, the JSON header's length. Outputs requested
    into shared memory are written there (``shm``: the registry) and only described in the body."""
    wanted = request.outputs or [RequestedOutput(n, request.binary_output) for n in outputs]
    entries, chunks = [], []
    for w in wanted:
        arr = np.ascontiguousarray(outputs[w.name])
        entry: dict[str, Any] = {"name": w.name, "datatype": datatype_of(arr.dtype), "shape": list(arr.shape)}
        raw = arr.astype(arr.dtype.newbyteorder("<"), copy=False).tobytes() if w.shm or w.binary else b""
        if w.shm is not None:
            region, offset, size = w.shm
            if len(raw) > size:
                raise ProtocolError(f"output '{w.name}' needs {len(raw)} bytes; its shared memory holds {size}")
            try:
                view = shm.view(region, offset, len(raw))
            except ValueError as exc:
                raise ProtocolError(f"output '{w.name}': {exc}") from exc
            view[:] = raw
            view.release()
            entry["parameters"] = {"shared_memory_region": region, "shared_memory_byte_size": len(raw)}
            if offset:
                entry["parameters"]["shared_memory_offset"] = offset
        elif w.binary:
            entry["parameters"] = {"binary_data_size": len(raw)}
            chunks.append(raw)
        else:
            entry["data"] = arr.reshape(-1).tolist()
        entries.append(entry)
    doc: dict[str, Any] = {"model_name": model, "model_version": version, "outputs": entries}
    if request.id is not None:
        doc["id"] = request.id
    head = json.dumps(doc, separators=(",", ":")).encode()
    if not chunks:
        return head, None
    return b"".join([head, *chunks]), len(head)


def encode_binary_request(
    inputs: dict[str, np.ndarray], outputs: list[str] | None = None, request_id: str | None = None
) -> tuple[bytes, int]:
    """A binary-tensor ``/infer`` body (what the load generator sends); returns (body, header length)."""
    entries, chunks = [], []
    for name, arr in inputs.items():
        raw = np.ascontiguousarray(arr).tobytes()
        entries.append(
            {
                "name": name,
                "datatype": datatype_of(arr.dtype),
                "shape": list(arr.shape),
                "parameters": {"binary_data_size": len(raw)},
            }
        )
        chunks.append(raw)
    doc: dict[str, Any] = {"inputs": entries, "parameters": {"binary_data_output": True}}
    if outputs is not None:
        doc["outputs"] = [{"name": n, "parameters": {"binary_data": True}} for n in outputs]
    if request_id is not None:
        doc["id"] = request_id
    head = json.dumps(doc, separators=(",", ":")).encode()
    return b"".join([head, *chunks]), len(head)


def decode_infer_response(body: bytes, header_length: str | int | None) -> tuple[dict, dict[str, np.ndarray]]:
    """The response's JSON document and its outputs as arrays (the load generator's and tests' reader)."""
    hl = int(header_length) if header_length is not None else len(body)
    doc = json.loads(body[:hl])
    offset, arrays = hl, {}
    for o in doc.get("outputs", []):
        dtype, shape = DATATYPES[o["datatype"]], tuple(o["shape"])
        size = (o.get("parameters") or {}).get("binary_data_size")
        if size is not None:
            arrays[o["name"]] = np.frombuffer(body[offset : offset + size], dtype=dtype).reshape(shape)
            offset += size
        else:
            arrays[o["name"]] = np.asarray(o["data"], dtype=dtype).reshape(shape)
    return doc, arrays
