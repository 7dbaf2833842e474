"""Text generation over real HTTP on 127.0.0.1: two concurrent streams get their own continuations,
the OpenAI and Triton shapes, every bad request a JSON 4xx, and a client that disconnects mid-stream
gives its KV-cache pages back."""

from __future__ import annotations

import json
import re
import socket
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def server(tiny_llm_fp32_artifact):
    from inferx_edge.serve.llm_server import LLMServer

    srv = LLMServer(
        tiny_llm_fp32_artifact,
        port=0,
        variant="fp32",
        max_sequences=2,
        kv_tokens=256,
        prefill_chunk=8,
        progress=lambda s: None,
    )
    t = threading.Thread(target=srv.run, daemon=True)
    t.start()
    assert srv.started.wait(30)
    yield srv
    srv.stop()
    t.join(30)


@pytest.fixture(scope="module")
def expected(tiny_llm_fp32_artifact):
    """Greedy continuations computed without the server."""
    from inferx_edge.runtime.llm import LLMEngine
    from inferx_edge.runtime.llm_scheduler import SamplingParams, generate

    def run(prompts, max_tokens):
        with LLMEngine(tiny_llm_fp32_artifact, variant="fp32") as e:
            outs = generate(e, [e.encode(p) for p in prompts], SamplingParams(max_tokens=max_tokens, temperature=0))
            return [e.tokenizer.decode(o) for o in outs]

    return run


def _post(server, path, body, raw=False):
    data = body if raw else json.dumps(body).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{server.port}{path}", data=data, method="POST")
    req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read(), r.headers
    except urllib.error.HTTPError as e:
        return e.code, e.read(), e.headers


def _sse(payload: bytes) -> list:
    events = [line[6:] for line in payload.decode().split("\n") if line.startswith("data: ")]
    return [e if e == "[DONE]" else json.loads(e) for e in events]


def _metric(server, name: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=30) as r:
        text = r.read().decode()
    m = re.search(rf"^{name}\{{[^}}]*\}} ([0-9.e+-]+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


def test_two_concurrent_streams_get_their_own_continuations(server, expected):
    prompts = ["The quick brown fox", "Once upon a time, in a land far"]
    want = expected(prompts, 24)

    def stream(prompt):
        status, body, headers = _post(
            server, "/v1/completions", {"prompt": prompt, "max_tokens": 24, "temperature": 0, "stream": True}
        )
        assert status == 200 and headers["Content-Type"].startswith("text/event-stream")
        events = _sse(body)
        assert events[-1] == "[DONE]" and events[-2]["choices"][0]["finish_reason"] in ("stop", "length")
        return "".join(e["choices"][0]["text"] for e in events[:-1])

    with ThreadPoolExecutor(2) as pool:
        got = list(pool.map(stream, prompts))
    assert got == want
    assert got[0] != got[1]


def test_completion_chat_and_triton_shapes(server, expected):
    status, body, _ = _post(server, "/v1/completions", {"prompt": "Hello", "max_tokens": 8, "temperature": 0})
    out = json.loads(body)
    assert status == 200 and out["object"] == "text_completion"
    assert out["choices"][0]["text"] == expected(["Hello"], 8)[0]
    assert out["usage"]["prompt_tokens"] == 5 and out["usage"]["completion_tokens"] >= 1

    status, body, _ = _post(
        server, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 6}
    )
    out = json.loads(body)
    assert status == 200 and out["object"] == "chat.completion"
    assert out["choices"][0]["message"]["role"] == "assistant"

    name = server.service.name
    status, body, _ = _post(server, f"/v2/models/{name}/generate", {"text_input": "Hello", "parameters": {"max_tokens": 8, "temperature": 0}})  # fmt: skip
    assert status == 200 and json.loads(body)["text_output"] == expected(["Hello"], 8)[0]
    status, body, _ = _post(server, f"/v2/models/{name}/generate_stream", {"text_input": "Hello", "parameters": {"max_tokens": 8, "temperature": 0}})  # fmt: skip
    events = _sse(body)
    assert status == 200 and "".join(e["text_output"] for e in events) == expected(["Hello"], 8)[0]
    with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/v1/models", timeout=30) as r:
        assert json.loads(r.read())["data"][0]["id"] == name


@pytest.mark.parametrize(
    ("path", "body", "status", "message"),
    [
        ("/v1/completions", b"{not json", 400, "not valid JSON"),
        ("/v1/completions", b"[1, 2]", 400, "JSON object"),
        ("/v1/completions", {"max_tokens": 4}, 400, "'prompt' is required"),
        ("/v1/completions", {"prompt": ""}, 400, "empty"),
        ("/v1/completions", {"prompt": "x" * 300}, 400, "the context holds 256"),
        ("/v1/completions", {"prompt": "hi", "max_tokens": 500}, 400, "lower max_tokens"),
        ("/v1/completions", {"prompt": "hi", "temperature": -1}, 400, "temperature"),
        ("/v1/completions", {"prompt": "hi", "top_p": 2}, 400, "top_p"),
        ("/v1/completions", {"prompt": "hi", "max_tokens": "ten"}, 400, "max_tokens"),
        ("/v1/completions", {"prompt": "hi", "stop": 5}, 400, "'stop'"),
        ("/v1/completions", {"prompt": [1, 2, 99999]}, 400, "token ids"),
        ("/v1/completions", {"prompt": "hi", "model": "gpt-4"}, 404, "unknown model 'gpt-4'"),
        ("/v1/chat/completions", {"messages": "hi"}, 400, "messages"),
        ("/v1/chat/completions", {"messages": [{"role": "user"}]}, 400, "messages[0]"),
        ("/v2/models/other/generate", {"text_input": "hi"}, 404, "unknown model"),
    ],
)
def test_bad_requests_get_clear_errors(server, path, body, status, message):
    got, payload, _ = _post(server, path, body, raw=isinstance(body, bytes))
    assert got == status
    assert message in json.loads(payload)["error"]


def test_disconnect_mid_stream_frees_pages(server):
    body = json.dumps({"prompt": "abc", "max_tokens": 250, "stream": True, "ignore_eos": True}).encode()
    s = socket.create_connection(("127.0.0.1", server.port), timeout=30)
    s.sendall(
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    seen = b""
    while b"data: " not in seen:
        seen += s.recv(4096)
    engine = server.service.engine
    with engine._lock:  # hold the scheduler's next step so the stream cannot finish on its own first
        assert _metric(server, "inferx_llm_kv_pages_used") > 0  # streaming: the sequence holds pages
        s.close()
        time.sleep(0.5)  # the server notices the disconnect and cancels the request
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and _metric(server, "inferx_llm_kv_pages_used") > 0:
        time.sleep(0.1)
    assert _metric(server, "inferx_llm_kv_pages_used") == 0
    assert _metric(server, "inferx_llm_sequences_running") == 0
    text = urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=30).read().decode()
    assert re.search(r'inferx_llm_requests_total\{model="[^"]+",outcome="cancelled"\} 1', text)


def test_stop_strings_end_the_text(server, expected):
    full = expected(["Hello"], 16)[0]
    if len(full) < 4:
        pytest.skip("continuation too short to cut")
    stop = full[2:4]
    status, body, _ = _post(
        server, "/v1/completions", {"prompt": "Hello", "max_tokens": 16, "temperature": 0, "stop": stop}
    )
    out = json.loads(body)
    assert status == 200 and out["choices"][0]["finish_reason"] == "stop"
    assert out["choices"][0]["text"] == full[: full.index(stop)]


def test_llm_loadgen_reports_ttft_and_tpot(server):
    from inferx_edge.serve.llm_loadgen import LLMLoadOptions, run_llm_load

    opts = LLMLoadOptions(
        url=f"http://127.0.0.1:{server.port}",
        requests=6,
        concurrency=3,
        prompt_len=(4, 20),
        output_len=(3, 9),
        vocab=250,
    )
    rec = run_llm_load(opts, progress=lambda s: None)
    assert rec["completed"] == 6 and rec["errors"] == 0
    assert rec["ttft_ms"]["p50"] > 0 and rec["tpot_ms"]["p50"] > 0 and rec["output_tokens_per_s"] > 0
