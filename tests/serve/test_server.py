"""The server over real HTTP on 127.0.0.1: Triton's own client against it, batching correctness,
every bad request answered with a JSON error, overload, timeouts, device errors, drain, auth, the
committed OpenAPI document, and the metrics' names."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from inferx_edge.serve.protocol import HEADER_LENGTH, decode_infer_response, encode_binary_request
from tests.helpers import REPO
from tests.serve.conftest import running_server, serve_options

MODEL = "fmnist_cnn"


def _url(server, path):
    return f"http://127.0.0.1:{server.port}{path}"


def _http(server, path, body=None, headers=None, method=None):
    req = urllib.request.Request(_url(server, path), data=body, headers=headers or {}, method=method)
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read(), r.headers
    except urllib.error.HTTPError as e:
        return e.code, e.read(), e.headers


def _infer(server, x, path=f"/v2/models/{MODEL}/infer"):
    body, hl = encode_binary_request({"image": x})
    status, data, headers = _http(server, path, body, {HEADER_LENGTH: str(hl)})
    if status != 200:
        return status, json.loads(data), headers
    return status, decode_infer_response(data, headers.get(HEADER_LENGTH))[1]["logits"], headers


def _images(n, seed=0):
    from inferx_edge.models import holdout

    x, _ = holdout()
    return np.ascontiguousarray(x[seed : seed + n].astype(np.float32))


def _reference(artifact, x, variant="fp32-b1"):
    from inferx_edge.runtime import Engine

    with Engine(artifact, variant=variant) as e:
        return np.concatenate([e.run(x[i : i + 1])["logits"] for i in range(len(x))])


def test_triton_client_works_unchanged(served_artifact):
    httpclient = pytest.importorskip("tritonclient.http")
    x = _images(3)
    with running_server([served_artifact], serve_options(fixed="fp32-b4")) as server:
        c = httpclient.InferenceServerClient(f"127.0.0.1:{server.port}")
        assert c.is_server_live() and c.is_server_ready() and c.is_model_ready(MODEL)
        meta = c.get_model_metadata(MODEL)
        assert meta["inputs"] == [{"name": "image", "datatype": "FP32", "shape": [-1, 1, 28, 28]}]
        version = meta["versions"][0]
        assert c.is_model_ready(MODEL, version)
        assert c.get_model_config(MODEL)["max_batch_size"] == 4
        assert "binary_tensor_data" in c.get_server_metadata()["extensions"]
        outs = []
        for binary in (True, False):
            inp = httpclient.InferInput("image", list(x.shape), "FP32")
            inp.set_data_from_numpy(x, binary_data=binary)
            want = [httpclient.InferRequestedOutput("logits", binary_data=binary)]
            r = c.infer(MODEL, [inp], outputs=want, model_version=version, request_id="abc")
            assert r.get_response()["id"] == "abc" and r.get_response()["model_version"] == version
            outs.append(r.as_numpy("logits"))
        np.testing.assert_array_equal(outs[0], outs[1])
        # a padded batch (3 rows on the batch-4 variant) gives what batch 1 gives
        np.testing.assert_allclose(outs[0], _reference(served_artifact, x), rtol=1e-5, atol=1e-5)
        with pytest.raises(Exception, match="unknown model 'nope'"):
            c.get_model_metadata("nope")


def test_concurrent_requests_are_batched_and_each_gets_its_own_rows(served_artifact):
    x = _images(40)
    ref = _reference(served_artifact, x)
    # a long queue delay makes batches form from several requests (and split ones across batches)
    options = serve_options(fixed="fp32-b4", max_queue_delay_s=0.02)
    sizes = [1, 3, 2, 5, 1, 4, 7, 2, 1, 3, 6, 5]  # 40 rows, some requests larger than a batch
    starts = np.cumsum([0, *sizes])[:-1]
    with running_server([served_artifact], options) as server:
        with ThreadPoolExecutor(len(sizes)) as pool:
            results = list(pool.map(lambda se: _infer(server, x[se[0] : se[0] + se[1]]), zip(starts, sizes)))
        rows = sum(server.metrics._counters["nv_inference_count"].values())
        execs = sum(server.metrics._counters["nv_inference_exec_count"].values())
    for (status, out, _), s, n in zip(results, starts, sizes):
        assert status == 200
        np.testing.assert_allclose(out, ref[s : s + n], rtol=1e-5, atol=1e-5)
    assert rows == 40 and execs < len(sizes) + 4  # requests shared batches


BAD_REQUESTS = [
    (b"{oops", {}, 400, "not valid JSON"),
    (
        json.dumps(
            {"inputs": [{"name": "img", "datatype": "FP32", "shape": [1, 1, 28, 28], "data": [0] * 784}]}
        ).encode(),
        {},
        400,
        "missing ['image'], unknown ['img']",
    ),
    (
        json.dumps(
            {"inputs": [{"name": "image", "datatype": "FP64", "shape": [1, 1, 28, 28], "data": [0] * 784}]}
        ).encode(),
        {},
        400,
        "input 'image' must be FP32, got FP64",
    ),
    (
        json.dumps(
            {"inputs": [{"name": "image", "datatype": "FP32", "shape": [1, 28, 28], "data": [0] * 784}]}
        ).encode(),
        {},
        400,
        "input 'image' must have shape image: FP32[-1, 1, 28, 28], got [1, 28, 28]",
    ),
    (
        json.dumps(
            {"inputs": [{"name": "image", "datatype": "FP32", "shape": [1, 1, 28, 28], "data": [float("nan")] * 784}]}
        )
        .replace("NaN", "NaN")
        .encode(),
        {},
        400,
        "input 'image' holds 784 NaN/Inf",
    ),
    (
        json.dumps({"inputs": [{"name": "image", "datatype": "FP32", "shape": [0, 1, 28, 28], "data": []}]}).encode(),
        {},
        400,
        "0 rows",
    ),
    (
        json.dumps(
            {
                "inputs": [{"name": "image", "datatype": "FP32", "shape": [1, 1, 28, 28], "data": [0] * 784}],
                "outputs": [{"name": "probs"}],
            }
        ).encode(),
        {},
        400,
        "unknown output 'probs'",
    ),
]


def test_bad_requests_get_json_errors_naming_the_problem(served_artifact):
    with running_server([served_artifact], max_request_bytes=1 << 16) as server:
        for body, headers, status, message in BAD_REQUESTS:
            got, data, _ = _http(server, f"/v2/models/{MODEL}/infer", body, headers)
            assert got == status, (message, data)
            assert message in json.loads(data)["error"]
        big = b"{" + b" " * (1 << 17) + b"}"
        got, data, _ = _http(server, f"/v2/models/{MODEL}/infer", big)
        assert got == 400 and "over the limit of 65536 bytes" in json.loads(data)["error"]
        got, data, _ = _http(server, "/v2/models/nope/infer", BAD_REQUESTS[1][0])
        assert got == 404 and "unknown model 'nope'; served models: fmnist_cnn" in json.loads(data)["error"]
        got, data, _ = _http(server, f"/v2/models/{MODEL}/versions/000000000000/infer", BAD_REQUESTS[1][0])
        assert got == 404 and "has no version '000000000000'" in json.loads(data)["error"]
        got, data, _ = _http(server, "/v3/anything")
        assert got == 404 and "error" in json.loads(data)
        got, data, _ = _http(server, f"/v2/models/{MODEL}/infer", method="GET")
        assert got == 405 and "error" in json.loads(data)
        # the server is still fine
        status, out, _ = _infer(server, _images(1))
        assert status == 200 and out.shape == (1, 10)
        failures = server.metrics._counters["nv_inference_request_failure"]
        assert sum(v for k, v in failures.items() if k[2] == "REJECTED") >= len(BAD_REQUESTS) + 1


def test_overload_is_503_with_retry_after_and_memory_stays_bounded(served_artifact, flaky_engine):
    flaky_engine.delay_s = 0.05
    options = serve_options(fixed="fp32-b1", max_queue_size=4, probe=False)
    x = _images(1)
    with running_server([served_artifact], options) as server:
        mv = server.repository.models[MODEL]
        depth = []

        def watch():
            while not stop.is_set():
                depth.append(mv.batcher.depth)
                stop.wait(0.005)

        stop = threading.Event()
        w = threading.Thread(target=watch)
        w.start()
        with ThreadPoolExecutor(48) as pool:
            results = list(pool.map(lambda _: _infer(server, x), range(240)))
        stop.set()
        w.join()
    codes = [r[0] for r in results]
    assert set(codes) <= {200, 503} and codes.count(503) > 0 and codes.count(200) > 0
    rejected = [r for r in results if r[0] == 503]
    assert all(int(r[2]["retry-after"]) >= 1 for r in rejected)
    assert "queue full" in rejected[0][1]["error"]
    assert max(depth) <= 4  # the queue never grows past its bound, however many clients flood it


def test_device_error_fails_its_batch_only_and_timeouts_are_504(served_artifact, flaky_engine):
    x = _images(2)
    with running_server([served_artifact], serve_options(fixed="fp32-b1", probe=False, timeout_s=0.5)) as server:
        poisoned = np.full_like(x[:1], flaky_engine.POISON)
        status, err, _ = _infer(server, poisoned)
        assert status == 500 and "illegal memory access" in err["error"]
        status, out, _ = _infer(server, x)
        assert status == 200 and out.shape == (2, 10)  # the server stays up
        flaky_engine.delay_s = 0.4
        with ThreadPoolExecutor(6) as pool:
            codes = [r[0] for r in pool.map(lambda _: _infer(server, x[:1]), range(6))]
        assert 504 in codes and set(codes) <= {200, 504}
        flaky_engine.delay_s = 0.0
        # batches already asleep in the engine finish first (on a loaded host a request behind them can
        # still time out); then the server answers again
        deadline = time.monotonic() + 10
        while (status := _infer(server, x)[0]) == 504 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert status == 200


def test_sigterm_style_stop_answers_every_accepted_request(served_artifact, flaky_engine):
    flaky_engine.delay_s = 0.2
    x = _images(1)
    with running_server([served_artifact], serve_options(fixed="fp32-b1", probe=False)) as server:
        mv = server.repository.models[MODEL]
        with ThreadPoolExecutor(6) as pool:
            futures = [pool.submit(_infer, server, x) for _ in range(6)]
            while mv.batcher.arrived_requests < 6:
                threading.Event().wait(0.01)
            server.stop()  # what SIGTERM does
            results = [f.result() for f in futures]
    assert [r[0] for r in results] == [200] * 6
    assert server.result is True


def test_hot_reload_swaps_versions_without_dropping_requests(served_artifact, fp32_artifact, tmp_path):
    from inferx_edge.deploy import deploy

    root = tmp_path / "dev"
    deploy(served_artifact, str(root), selftest=False, log=lambda *a: None)
    x = _images(2)
    with running_server([root], serve_options(probe=False), reload_interval_s=0.2) as server:
        v1 = server.repository.models[MODEL].version
        stop, codes = threading.Event(), []

        def load():
            while not stop.is_set():
                codes.append(_infer(server, x)[0])

        workers = [threading.Thread(target=load) for _ in range(3)]
        for w in workers:
            w.start()
        deploy(fp32_artifact, str(root), selftest=False, log=lambda *a: None)
        for _ in range(300):
            if server.repository.models[MODEL].version != v1:
                break
            threading.Event().wait(0.05)
        threading.Event().wait(0.5)
        stop.set()
        for w in workers:
            w.join()
        v2 = server.repository.models[MODEL].version
        status, meta, _ = _http(server, f"/v2/models/{MODEL}")
        assert json.loads(meta)["versions"] == [v2]
        assert _http(server, f"/v2/models/{MODEL}/versions/{v1}/ready")[0] == 404
    assert v2 != v1
    assert codes and set(codes) == {200}


def test_request_read_across_a_hot_reload_goes_to_the_new_version(served_artifact, fp32_artifact, tmp_path):
    """A request resolved to the old version while its body was still arriving, submitted after the swap:
    the old version takes nothing new, so the request is answered by the version now served."""
    import http.client

    from inferx_edge.deploy import deploy

    root = tmp_path / "dev"
    deploy(served_artifact, str(root), selftest=False, log=lambda *a: None)
    body, hl = encode_binary_request({"image": _images(1)})
    with running_server([root], serve_options(probe=False), reload_interval_s=0.1) as server:
        old = server.repository.models[MODEL]
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
        conn.putrequest("POST", f"/v2/models/{MODEL}/infer")
        conn.putheader(HEADER_LENGTH, str(hl))
        conn.putheader("Content-Length", str(len(body)))
        conn.endheaders()
        conn.send(body[:10])  # the handler has resolved the model and waits for the rest of the body
        threading.Event().wait(0.3)
        deploy(fp32_artifact, str(root), selftest=False, log=lambda *a: None)
        for _ in range(300):
            if server.repository.models[MODEL] is not old and old.state != "ready":
                break
            threading.Event().wait(0.05)
        assert old.state != "ready", "the old version did not start draining"
        conn.send(body[10:])
        r = conn.getresponse()
        data, headers = r.read(), r.headers
        conn.close()
    assert r.status == 200, data
    assert decode_infer_response(data, headers.get(HEADER_LENGTH))[0]["model_version"] != old.version


def test_drain_runs_every_request_it_accepted(served_artifact, flaky_engine):
    """A version drained (hot reload, shutdown) while requests wait in its queue runs them all; the
    scheduler used to stop at the first wait for a free device and fail the rest with 503."""
    flaky_engine.delay_s = 0.2
    x = {"image": _images(1)}
    done = []
    with running_server([served_artifact], serve_options(probe=False, fixed="fp32-b1")) as server:
        mv = server.repository.models[MODEL]
        for _ in range(4):  # one runs, one waits for the worker, two stay queued
            mv.submit(x, done.append)
        threading.Event().wait(0.05)
        assert mv.drain(30)
    assert len(done) == 4 and [r.error for r in done] == [None] * 4


def test_non_loopback_bind_needs_a_token_and_the_token_is_checked(served_artifact, tmp_path):
    from inferx_edge.errors import UsageError
    from inferx_edge.serve.server import Server, read_token

    with pytest.raises(UsageError, match="--auth-token-file FILE .* or --insecure-bind"):
        Server([served_artifact], serve_options(), host="0.0.0.0", port=0, progress=lambda *a: None)
    (tmp_path / "short").write_text("abc")
    with pytest.raises(UsageError, match="at least 16 characters"):
        read_token(tmp_path / "short")
    token = "s3cret-token-0123456789"
    with running_server([served_artifact], serve_options(probe=False), auth_token=token) as server:
        assert _http(server, "/v2/health/ready")[0] == 200  # probes need no token
        status, data, headers = _http(server, f"/v2/models/{MODEL}")
        assert status == 401 and "bearer token" in json.loads(data)["error"]
        assert _http(server, "/metrics", headers={"Authorization": "Bearer wrong"})[0] == 401
        assert _http(server, f"/v2/models/{MODEL}", headers={"Authorization": f"Bearer {token}"})[0] == 200


def test_openapi_document_is_committed_and_every_path_has_a_stability_mark(served_artifact):
    committed = json.loads((REPO / "docs" / "openapi.json").read_text())
    with running_server([served_artifact], serve_options(probe=False)) as server:
        served = json.loads(_http(server, "/openapi.json")[1])
    assert served == committed, "the served API changed: regenerate docs/openapi.json (docs/serving.md says how)"
    for path, ops in served["paths"].items():
        for op in ops.values():
            assert op["x-stability"] in ("stable", "preview"), path


def test_metrics_use_tritons_names_and_ours(served_artifact, tmp_path):
    from prometheus_client.parser import text_string_to_metric_families

    from inferx_edge.serve.metrics import TRITON_METRICS

    # replay telemetry: a sensor reading ~50 W, so energy metrics exist on this CPU-only machine
    trace = tmp_path / "power.jsonl"
    trace.write_text("".join(json.dumps({"t": i * 0.05, "power_w": 50.0 + (i % 7)}) + "\n" for i in range(20000)))
    options = serve_options(telemetry=f"replay:{trace}", window_s=0.2)
    with running_server([served_artifact], options) as server:
        for n in (1, 3, 1, 2):
            assert _infer(server, _images(n))[0] == 200
        threading.Event().wait(0.6)
        text = _http(server, "/metrics")[1].decode()
    names = {s.name for fam in text_string_to_metric_families(text) for s in fam.samples}
    for name in TRITON_METRICS:
        assert name in names, name
    for name in (
        "inferx_energy_joules_total",
        "inferx_power_watts",
        "inferx_governor_variant",
        "inferx_governor_switches_total",
        "inferx_queue_depth",
        "inferx_request_latency_seconds_bucket",
        "inferx_arrival_rate",
    ):
        assert name in names, name
    assert 'inferx_request_latency_seconds_bucket{input_size="4"' in text  # 3 rows -> the 4 bucket


def test_loadgen_reports_latency_throughput_and_energy(served_artifact, tmp_path):
    from inferx_edge.serve.loadgen import LoadgenOptions, Phase, run_loadgen

    trace = tmp_path / "power.jsonl"
    trace.write_text("".join(json.dumps({"t": i * 0.05, "power_w": 40.0}) + "\n" for i in range(20000)))
    with running_server([served_artifact], serve_options(telemetry=f"replay:{trace}", window_s=0.2)) as server:
        url = f"http://127.0.0.1:{server.port}"
        lines = []
        rec = run_loadgen(
            LoadgenOptions(url, MODEL, "server", phases=[Phase(1.0, 50.0), Phase(1.0, 100.0)], concurrency=4),
            progress=lines.append,
        )
        off = run_loadgen(LoadgenOptions(url, MODEL, "offline", duration_s=0.5, concurrency=2, rows=3))
        single = run_loadgen(LoadgenOptions(url, MODEL, "single-stream", duration_s=0.5))
    assert rec["errors"] == 0 and len(rec["phases"]) == 2 and lines
    for p in rec["phases"]:
        assert p["ok"] > 10 and p["latency_ms"]["p99"] >= p["latency_ms"]["p50"] > 0
    assert any(p["joules_per_inference"] for p in rec["phases"])
    assert off["errors"] == 0 and off["rows_per_request"] == 3 and off["throughput_inf_s"] > 0
    assert single["phases"][0]["ok"] > 0


def test_serve_cli_refuses_bad_flags(served_artifact, tmp_path):
    from tests.helpers import cli

    r = cli("serve", str(served_artifact), "--policy", "latency-slo")
    assert r.returncode == 2 and "--policy latency-slo needs --p99" in r.stderr
    r = cli("serve", str(tmp_path / "missing.ixa"))
    assert r.returncode == 2 and "does not exist" in r.stderr
    r = cli("serve", str(served_artifact), "--host", "0.0.0.0")
    assert r.returncode == 2 and "--insecure-bind" in r.stderr
    r = cli("loadgen", "http://127.0.0.1:1", "-m", MODEL)
    assert r.returncode == 2 and "cannot reach" in r.stderr


def test_sigterm_drains_in_flight_requests_and_exits_0(served_artifact, tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import time

    from tests.helpers import free_port

    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "inferx_edge",
        "serve",
        str(served_artifact),
        "--port",
        str(port),
        "--variant",
        "fp32-b4",
        "--max-queue-delay-us",
        "1500000",
        "--telemetry",
        "none",
    ]
    proc = subprocess.Popen(
        cmd,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    server = type("S", (), {"port": port})()
    try:
        for _ in range(300):
            try:
                if _http(server, "/v2/health/ready")[0] == 200:
                    break
            except OSError:
                pass
            time.sleep(0.1)
        else:
            raise AssertionError(proc.stderr.read() if proc.poll() is not None else "server did not start")
        x = _images(2)
        with ThreadPoolExecutor(2) as pool:
            futures = [pool.submit(_infer, server, x[i : i + 1]) for i in range(2)]
            time.sleep(0.5)  # both wait in the queue for the batch to fill (1.5 s)
            proc.send_signal(signal.SIGTERM)
            results = [f.result() for f in futures]
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert [r[0] for r in results] == [200, 200], results
    assert proc.returncode == 0, err
    assert "every accepted request answered" in out


def test_system_shared_memory_with_tritons_client(served_artifact):
    httpclient = pytest.importorskip("tritonclient.http")
    shm = pytest.importorskip("tritonclient.utils.shared_memory")
    x = _images(3)
    out_bytes = 3 * 10 * 4
    with running_server([served_artifact], serve_options(fixed="fp32-b4", probe=False), shared_memory=True) as server:
        c = httpclient.InferenceServerClient(f"127.0.0.1:{server.port}")
        assert "system_shared_memory" in c.get_server_metadata()["extensions"]
        ih = shm.create_shared_memory_region("in0", "/inferx_test_in0", x.nbytes)
        oh = shm.create_shared_memory_region("out0", "/inferx_test_out0", out_bytes)
        try:
            shm.set_shared_memory_region(ih, [x])
            c.register_system_shared_memory("in0", "/inferx_test_in0", x.nbytes)
            c.register_system_shared_memory("out0", "/inferx_test_out0", out_bytes)
            assert {r["name"] for r in c.get_system_shared_memory_status()} == {"in0", "out0"}
            inp = httpclient.InferInput("image", list(x.shape), "FP32")
            inp.set_shared_memory("in0", x.nbytes)
            out = httpclient.InferRequestedOutput("logits", binary_data=True)
            out.set_shared_memory("out0", out_bytes)
            r = c.infer(MODEL, [inp], outputs=[out])
            assert r.get_output("logits")["parameters"]["shared_memory_region"] == "out0"
            got = shm.get_contents_as_numpy(oh, np.float32, [3, 10])
            np.testing.assert_allclose(got, _reference(served_artifact, x), rtol=1e-5, atol=1e-5)
            with pytest.raises(Exception, match="already registered"):
                c.register_system_shared_memory("in0", "/inferx_test_in0", x.nbytes)
            with pytest.raises(Exception, match="exceed the"):
                c.register_system_shared_memory("big", "/inferx_test_in0", x.nbytes * 10)
            with pytest.raises(Exception, match="must be a POSIX shm name"):
                c.register_system_shared_memory("evil", "/../etc/passwd", 4)
            bad = httpclient.InferInput("image", list(x.shape), "FP32")
            bad.set_shared_memory("in0", x.nbytes - 4)
            with pytest.raises(Exception, match="shared_memory_byte_size"):
                c.infer(MODEL, [bad])
            c.unregister_system_shared_memory()
            assert c.get_system_shared_memory_status() == []
        finally:
            shm.destroy_shared_memory_region(ih)
            shm.destroy_shared_memory_region(oh)
        from inferx_edge.serve.loadgen import LoadgenOptions, run_loadgen

        rec = run_loadgen(
            LoadgenOptions(
                f"http://127.0.0.1:{server.port}",
                MODEL,
                "offline",
                duration_s=0.5,
                concurrency=2,
                rows=4,
                shared_memory=True,
            )
        )
        assert rec["errors"] == 0 and rec["phases"][0]["ok"] > 0 and rec["shared_memory"]
        assert _http(server, "/v2/systemsharedmemory/status")[1] == b"[]"  # loadgen cleaned up
    with running_server([served_artifact], serve_options(probe=False)) as server:  # off by default
        status, data, _ = _http(server, "/v2/systemsharedmemory/status")
        assert status == 400 and "--shared-memory" in json.loads(data)["error"]
