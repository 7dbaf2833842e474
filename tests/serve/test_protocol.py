"""The v2 wire format: JSON and binary tensors both ways, and every malformed body refused with a
ProtocolError that names the tensor (never another exception)."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inferx_edge.serve.protocol import (
    ProtocolError,
    decode_infer_response,
    decompress,
    encode_binary_request,
    encode_infer_response,
    parse_infer_request,
)


def _json(doc) -> bytes:
    return json.dumps(doc).encode()


def test_json_and_binary_requests_decode_to_the_same_arrays():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3)).astype(np.float32)
    ids = rng.integers(-5, 5, (2, 4)).astype(np.int64)
    body, hl = encode_binary_request({"x": x, "ids": ids}, outputs=["y"], request_id="r1")
    req = parse_infer_request(body, hl)
    assert req.id == "r1" and [o.name for o in req.outputs] == ["y"] and req.outputs[0].binary
    np.testing.assert_array_equal(req.inputs["x"], x)
    np.testing.assert_array_equal(req.inputs["ids"], ids)
    doc = {
        "inputs": [
            {"name": "x", "datatype": "FP32", "shape": [2, 3], "data": x.tolist()},
            {"name": "ids", "datatype": "INT64", "shape": [2, 4], "data": ids.reshape(-1).tolist()},
        ]
    }
    req2 = parse_infer_request(_json(doc), None)
    np.testing.assert_array_equal(req2.inputs["x"], x)
    np.testing.assert_array_equal(req2.inputs["ids"], ids)
    assert req2.outputs is None and not req2.binary_output


@pytest.mark.parametrize("binary", [True, False])
def test_responses_round_trip(binary):
    y = np.arange(12, dtype=np.float32).reshape(3, 4)
    body, hl = encode_binary_request({"x": y})
    req = parse_infer_request(body, hl)
    req.binary_output = binary
    payload, header_len = encode_infer_response("m", "v1", req, {"y": y})
    assert (header_len is not None) == binary
    doc, arrays = decode_infer_response(payload, header_len)
    assert doc["model_name"] == "m" and doc["model_version"] == "v1"
    np.testing.assert_array_equal(arrays["y"], y)


BAD = [
    (b"{not json", None, "not valid JSON"),
    (_json([1, 2]), None, "JSON object"),
    (_json({"inputs": []}), None, "non-empty 'inputs'"),
    (_json({"inputs": [{"datatype": "FP32", "shape": [1], "data": [1]}]}), None, "string 'name'"),
    (
        _json({"inputs": [{"name": "x", "datatype": "FLOAT", "shape": [1], "data": [1]}]}),
        None,
        "datatype 'FLOAT' is not supported; valid: BOOL",
    ),
    (
        _json({"inputs": [{"name": "x", "datatype": [], "shape": [1], "data": [1]}]}),
        None,
        "datatype [] is not supported; valid: BOOL",
    ),
    (
        _json({"inputs": [{"name": "x", "datatype": "FP32", "shape": [2, "a"], "data": [1]}]}),
        None,
        "'shape' must be a list of integers",
    ),
    (_json({"inputs": [{"name": "x", "datatype": "FP32", "shape": [-1], "data": [1]}]}), None, "negative dimension"),
    (
        _json({"inputs": [{"name": "x", "datatype": "FP32", "shape": [3], "data": [1, 2]}]}),
        None,
        "holds 2 elements, shape [3] needs 3",
    ),
    (_json({"inputs": [{"name": "x", "datatype": "FP32", "shape": [2], "data": [[1], [2, 3]]}]}), None, "input 'x'"),
    (_json({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": ["a"]}]}), None, "must hold numbers"),
    (
        _json({"inputs": [{"name": "x", "datatype": "INT8", "shape": [1], "data": [1.5]}]}),
        None,
        "INT8 data must be integers",
    ),
    (
        _json({"inputs": [{"name": "x", "datatype": "INT8", "shape": [1], "data": [300]}]}),
        None,
        "out of range for INT8",
    ),
    (_json({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1]}]}), None, "neither 'data' nor"),
    (_json({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [1]}] * 2}), None, "given twice"),
    (
        _json({"inputs": [{"name": "x", "datatype": "FP32", "shape": [2], "parameters": {"binary_data_size": 4}}]}),
        "9999",
        "outside the body",
    ),
    (
        _json({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [1]}], "outputs": "y"}),
        None,
        "'outputs' must be a list",
    ),
    (
        _json({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [1]}], "id": 5}),
        None,
        "'id' must be a string",
    ),
]


@pytest.mark.parametrize("body,hl,message", BAD)
def test_malformed_requests_name_the_problem(body, hl, message):
    with pytest.raises(ProtocolError, match=None) as e:
        parse_infer_request(body, hl)
    assert message in str(e.value)


def test_binary_sizes_must_add_up():
    x = np.zeros((2, 2), np.float32)
    body, hl = encode_binary_request({"x": x})
    head = json.loads(body[:hl])
    with pytest.raises(ProtocolError, match="ends after 8 of its 16 bytes"):
        parse_infer_request(body[:-8], hl)
    with pytest.raises(ProtocolError, match="4 bytes of binary data follow"):
        parse_infer_request(body + b"\0" * 4, hl)
    head["inputs"][0]["parameters"]["binary_data_size"] = 12
    h = json.dumps(head).encode()
    with pytest.raises(ProtocolError, match=r"binary_data_size 12 does not match FP32\[2, 2\] \(16 bytes\)"):
        parse_infer_request(h + body[hl:], len(h))
    with pytest.raises(ProtocolError, match="must be an integer"):
        parse_infer_request(body, "ten")


def test_compressed_bodies_and_bombs():
    body = _json({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [1]}]})
    assert decompress(gzip.compress(body), "gzip", 1 << 20) == body
    with pytest.raises(ProtocolError, match="exceeds the request size limit"):
        decompress(gzip.compress(b"\0" * (1 << 20)), "gzip", 1000)
    with pytest.raises(ProtocolError, match="not valid gzip"):
        decompress(b"garbage", "gzip", 1000)
    with pytest.raises(ProtocolError, match="valid: gzip, deflate, identity"):
        decompress(body, "br", 1000)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300), st.one_of(st.none(), st.integers(-5, 400).map(str), st.text(max_size=4)))
def test_any_bytes_are_a_request_or_a_protocol_error(body, hl):
    try:
        parse_infer_request(body, hl)
    except ProtocolError:
        pass


@settings(max_examples=200, deadline=None)
@given(
    st.recursive(
        st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=5)),
        lambda c: st.one_of(
            st.lists(c, max_size=4),
            st.dictionaries(
                st.sampled_from(["name", "datatype", "shape", "data", "parameters", "binary_data_size"]), c, max_size=5
            ),
        ),
        max_leaves=20,
    )
)
def test_any_json_is_a_request_or_a_protocol_error(inputs):
    try:
        parse_infer_request(_json({"inputs": inputs}), None)
    except ProtocolError:
        pass
