"""The governor inside the server: its queueing model picks batch 1 at low load and a large batch when
batch 1 cannot keep up, the FPS floor is compared with live demand, routing between devices follows
measured latency/energy, and a server driven by replay telemetry logs every decision."""

from __future__ import annotations

import json
import threading
from types import SimpleNamespace

import numpy as np
import pytest

from inferx_edge.package import TensorSpec, Variant
from inferx_edge.serve.batcher import DeviceSlot
from inferx_edge.serve.live import GovernorOptions, LiveGovernor


def _variant(precision, batch):
    return Variant(
        name=f"{precision}-b{batch}",
        precision=precision,
        batch=batch,
        library="x.so",
        weights=None,
        params=(),
        inputs=(TensorSpec("x", (batch, 4), "float32"),),
        outputs=(TensorSpec("y", (batch, 2), "float32"),),
    )


def _slot(label, timings, idle_w=50.0):
    """A device slot with measured timings {variant: (seconds, active watts)} and no engine."""
    variants = [_variant(*name.split("-b")[0:1], int(name.split("-b")[1])) for name in timings]
    engine = SimpleNamespace(manifest=SimpleNamespace(variants=variants))
    slot = DeviceSlot(engine, label)
    slot.idle_w = idle_w
    for name, (sec, watts) in timings.items():
        slot.timing[name].seconds = sec
        slot.timing[name].active_w = watts
    return slot


def _governor(slots, **kw):
    opts = GovernorOptions(**{"dwell_s": 0.0, **kw})
    decisions = []
    return LiveGovernor(slots, opts, max_queue_delay_s=0.005, log=decisions.append), decisions


def _window(lam):
    return {"requests": 0, "p99_ms": None, "j_per_frame": None, "devices": {}, "arrival_fps": lam}


def test_latency_slo_picks_batch_1_at_low_load_and_a_batch_when_1_cannot_keep_up():
    slot = _slot("gpu", {"fp32-b1": (0.001, 150.0), "fp32-b8": (0.002, 160.0)})
    gov, log = _governor([slot], policy="latency-slo", p99_ms=20.0)
    t = 0.0
    picks = []
    for lam in (50, 50, 3000, 3000, 50, 50):
        t += 1
        gov.decide(t, lam, _window(lam))
        picks.append(gov.current)
    assert picks == ["fp32-b1", "fp32-b1", "fp32-b8", "fp32-b8", "fp32-b1", "fp32-b1"]
    low = gov.predict(gov.points["fp32-b8"], 50)
    assert low.p99_ms < 20 and low.j_per_frame > gov.predict(gov.points["fp32-b1"], 50).j_per_frame
    assert gov.predict(gov.points["fp32-b1"], 3000).p99_ms == pytest.approx(1e12)  # cannot keep up
    assert gov.switches == 2 and log[-1]["points"]["fp32-b8"]["batch"] == 8


def test_min_energy_floor_is_compared_with_live_demand():
    # b8 is cheaper per frame when full, b1 when load is light; capacity b1 = 1000/s, b8 = 4000/s
    slot = _slot("gpu", {"fp32-b1": (0.001, 150.0), "fp32-b8": (0.002, 150.0)})
    gov, _ = _governor([slot], policy="min-energy", fps_floor=3000.0)
    gov.decide(1.0, 20.0, _window(20.0))
    assert gov.current == "fp32-b1"  # demand 20/s: the floor of 3000/s is not what b1 must sustain
    gov.decide(2.0, 2900.0, _window(2900.0))
    assert gov.current == "fp32-b8"  # now it is


def test_routing_prefers_the_device_that_finishes_first_or_costs_less():
    gpu = _slot("cuda:0", {"fp32-b1": (0.001, 300.0), "fp32-b8": (0.0015, 320.0)}, idle_w=80.0)
    cpu = _slot("cpu", {"fp32-b1": (0.004, 60.0), "fp32-b8": (0.02, 65.0)}, idle_w=20.0)
    gov, _ = _governor([gpu, cpu], policy="max-throughput")
    slot, v = gov.route(3, "fp32")
    assert slot is gpu and v.name == "fp32-b8"
    gpu.busy_until = 1e18  # the GPU is backed up: the CPU finishes first
    assert gov.route(1, "fp32")[0] is cpu
    gpu.busy_until = cpu.busy_until = 0.0
    gov2, _ = _governor([gpu, cpu], policy="min-energy", fps_floor=1.0)
    # batch 1: GPU (300-80) W x 1 ms = 0.22 J, CPU (60-20) W x 4 ms = 0.16 J, both finish within slack
    assert gov2.route(1, "fp32")[0] is cpu


def test_without_power_telemetry_energy_is_device_time_and_the_log_says_so():
    slot = _slot("cpu", {"fp32-b1": (0.001, None), "fp32-b8": (0.002, None)}, idle_w=None)
    gov, log = _governor([slot], policy="min-energy", fps_floor=100.0)
    gov.decide(1.0, 2000.0, _window(2000.0))
    assert "no power telemetry" in log[-1]["energy_note"]
    assert gov.current == "fp32-b8"  # fewer device-seconds per frame when batches fill


def test_server_runs_the_governor_on_replay_telemetry(served_artifact, tmp_path):
    from tests.serve.conftest import running_server, serve_options
    from tests.serve.test_server import _images, _infer

    trace = tmp_path / "power.jsonl"
    trace.write_text("".join(json.dumps({"t": i * 0.05, "power_w": 30.0 + 20 * (i % 2)}) + "\n" for i in range(40000)))
    decisions = tmp_path / "decisions.jsonl"
    options = serve_options(telemetry=f"replay:{trace}", policy="latency-slo", p99_ms=50.0, window_s=0.2, dwell_s=0.0)
    x = _images(1)
    with running_server([served_artifact], options, decision_log=decisions) as server:
        stop = threading.Event()

        def load():
            while not stop.is_set():
                assert _infer(server, x)[0] == 200

        threads = [threading.Thread(target=load) for _ in range(2)]
        for t in threads:
            t.start()
        threading.Event().wait(1.5)
        stop.set()
        for t in threads:
            t.join()
        mv = server.repository.models["fmnist_cnn"]
        gauges = dict(server.metrics._gauges["inferx_governor_variant"])
    lines = [json.loads(x) for x in decisions.read_text().splitlines()]
    assert len(lines) >= 4
    with_power = [d for d in lines if d["window"].get("devices", {}).get("cpu", {}).get("watts")]
    assert with_power and 30.0 <= with_power[-1]["window"]["devices"]["cpu"]["watts"] <= 50.0
    assert all(d["policy"] == "latency-slo" and d["choice"] in mv.governor.points for d in lines)
    assert any(d["window"].get("requests") for d in lines)
    assert sum(v for k, v in gauges.items()) == 1.0  # exactly one operating point runs
    assert np.isfinite([d["points"][d["choice"]]["p99_ms"] for d in lines]).all()


def test_a_named_sensor_only_measures_its_own_kind_of_device():
    from inferx_edge.serve.repository import open_telemetry

    assert open_telemetry("nvml", "cpu", 0) is None  # never the GPU's power for a CPU engine
    assert open_telemetry("rapl", "cuda", 0) is None
    assert open_telemetry("none", "cuda", 0) is None


def test_backlog_alarm_goes_to_the_most_capacity_then_steps_down_without_dwell():
    slot = _slot("gpu", {"fp32-b1": (0.001, 150.0), "fp32-b8": (0.002, 160.0)})
    gov, log = _governor([slot], policy="latency-slo", p99_ms=20.0, dwell_s=60.0)
    gov.decide(1.0, 50, _window(50))
    assert gov.current == "fp32-b1" and gov.alarm_rows == pytest.approx(1000 * 0.010)  # b1 clears 10 rows/10 ms
    burst = {**_window(900), "queued_rows": 40, "seconds": 0.01, "alarm": True}
    gov.decide(1.01, 900, burst)
    assert gov.current == "fp32-b8" and "backlog alarm" in log[-1]["reason"]
    gov.decide(1.3, 50, {**_window(50), "seconds": 0.29})  # a false alarm: back down at once, dwell or not
    assert gov.current == "fp32-b1"


def test_a_point_that_cannot_keep_up_is_left_whatever_its_served_requests_measured():
    slot = _slot("gpu", {"fp32-b1": (0.001, 150.0), "fp32-b8": (0.002, 160.0)})
    gov, _ = _governor([slot], policy="latency-slo", p99_ms=20.0)
    gov.decide(1.0, 50, _window(50))
    # 3000/s arrive; the requests b1 finished in the window were quick (the queue grows behind them)
    gov.decide(2.0, 3000, {**_window(3000), "requests": 500, "p99_ms": 2.0, "seconds": 1.0})
    assert gov.current == "fp32-b8"


def test_the_batcher_wakes_the_governor_when_its_queue_outgrows_the_alarm(served_artifact, flaky_engine, tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    from tests.serve.conftest import running_server, serve_options
    from tests.serve.test_server import _images, _infer

    flaky_engine.delay_s = 0.02
    decisions = tmp_path / "decisions.jsonl"
    # a window far longer than the test: only the alarm can make a decision while it runs
    options = serve_options(policy="latency-slo", p99_ms=10.0, window_s=600.0, dwell_s=600.0, probe=False)
    x = _images(1)
    with running_server([served_artifact], options, decision_log=decisions) as server:
        mv = server.repository.models["fmnist_cnn"]
        assert mv.governor.alarm_rows <= 5  # b1 at the 1 ms it is taken to run: 5 rows in half the SLO
        with ThreadPoolExecutor(32) as pool:
            codes = list(pool.map(lambda _: _infer(server, x)[0], range(200)))
        assert mv.batcher.queued_rows == 0
    assert set(codes) == {200}
    lines = [json.loads(x) for x in decisions.read_text().splitlines()]
    alarms = [d for d in lines if d["window"].get("alarm")]
    assert alarms and "backlog alarm" in alarms[0]["reason"] and alarms[0]["window"]["queued_rows"] > 0


def test_a_delay_every_point_shares_is_added_to_all_and_no_point_is_chased_for_escaping_it():
    """Measured p99 far above the model's (front end, busy host): the gap goes onto every point's
    prediction; with none meeting the SLO the governor holds the measured-closest point instead of
    flapping to one only predicted to be better."""
    slot = _slot("gpu", {"fp32-b1": (0.001, 150.0), "fp32-b8": (0.002, 160.0)})
    gov, log = _governor([slot], policy="latency-slo", p99_ms=20.0)
    gov.decide(1.0, 50, _window(50))
    assert gov.current == "fp32-b1"
    busy = {**_window(600), "requests": 300, "p99_ms": 120.0, "seconds": 1.0}
    for t in (2.0, 3.0, 4.0):
        gov.decide(t, 600, busy)
    assert gov.current == "fp32-b1" and gov.switches == 0
    assert gov.p99_gap_ms > 90 and log[-1]["points"]["fp32-b8"]["p99_ms"] > 90
    assert "unmet by all" in log[-1]["reason"] or "nothing meets the constraint" in log[-1]["reason"]
