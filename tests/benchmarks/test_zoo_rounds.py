"""benchmarks/zoo.py --rounds: systems timed in interleaved windows, rows report medians, the table the
spread of the per-round ratios; a system that fails mid-run is recorded and the others finish."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest


class FakeRunner:
    """A runner whose every timing window reports the next throughput in ``fps`` (img/s at batch 1)."""

    def __init__(self, name, fps, log, fail_at=None):
        self.name, self.fps, self.log, self.fail_at, self.windows = name, list(fps), log, fail_at, 0

    def benchmark(self, x, warmup=5, repeat=50, min_seconds=0.0):
        if warmup == 0:  # measure_window's call: one timing window
            if self.windows == self.fail_at:
                raise RuntimeError("CUDA error: an illegal memory access was encountered")
            self.log.append(self.name)
            fps = self.fps[self.windows]
            self.windows += 1
            ms = 1e3 / fps
            return SimpleNamespace(count=100, mean_ms=ms, p50_ms=ms, p90_ms=ms * 1.1, p99_ms=ms * 1.2)
        return None


def run_measure(rounds, ours_fps, peer_fps, fail_at=None):
    from benchmarks.zoo import markdown, measure

    log: list[str] = []
    ours = FakeRunner("torch-eager", ours_fps, log, fail_at)
    peer = FakeRunner("torch-compile", peer_fps, log)
    out = np.ones((1, 4))
    peers = {
        ("m", 1): {
            "x": {"input": np.zeros((1, 4), np.float32)},
            "ref": out,
            "torch-eager": (ours, [out], 1.0),
            "torch-compile": (peer, [out * 1.01], 2.0),
        }
    }
    systems = ["torch-eager", "torch-compile"]
    record = {"results": [], "systems": systems, "target": "h200", "build_only": False, "builds": [], "rounds": rounds}
    model = SimpleNamespace(name="m")
    measure(record, [model], {"m": None}, {}, systems, (1,), False, 0.01, lambda: None, peers, rounds)
    return record, log, markdown(record)


def test_rounds_interleave_the_systems_and_report_medians_and_the_ratio_spread():
    record, log, table = run_measure(3, [100, 300, 200], [100, 100, 100])
    # round 0 forward, round 1 reversed, round 2 forward: a drift over the run falls on both systems
    assert log == ["torch-eager", "torch-compile", "torch-compile", "torch-eager", "torch-eager", "torch-compile"]
    ours, peer = record["results"]
    assert ours["img_s"] == pytest.approx(200) and peer["img_s"] == pytest.approx(100)
    assert [r["img_s"] for r in ours["rounds"]] == pytest.approx([100, 300, 200])
    assert ours["rel_error_vs_fp32"] == 0.0 and peer["rel_error_vs_fp32"] == pytest.approx(0.01)
    assert "Medians of 3 interleaved windows" in table
    assert "| m | torch-eager | 1 | 200.0 |" in table and "| 2.00x |" in table and "| 1.00-3.00x |" in table


def test_one_round_keeps_the_single_window_table():
    record, log, table = run_measure(1, [150], [100])
    assert log == ["torch-eager", "torch-compile"] and "rounds" not in record["results"][0]
    assert "interleaved" not in table and "per round" not in table and "| 1.50x |" in table
    assert "SM MHz" not in table  # no telemetry, no clock column


def test_the_table_shows_the_clock_range_each_system_ran_at():
    from benchmarks.zoo import markdown

    rows = [
        {"model": "m", "system": s, "batch": 64, "img_s": f, "p50_ms": 1.0, "rel_error_vs_fp32": 0.0, "sm_mhz": mhz}
        for s, f, mhz in (("inferx-int8", 150.0, [1980.0, 1980.0]), ("torch-compile", 100.0, [1755.0, 1980.0]))
    ]
    record = {"results": rows, "systems": ["inferx-int8", "torch-compile"], "target": "h200", "build_only": False}
    table = markdown(record | {"builds": []})
    assert "| SM MHz |" in table and "| 1980 | 0.00e+00 | 1.50x |" in table and "| 1755-1980 |" in table


def test_a_run_without_a_peer_has_no_ratio_columns():
    """An A/B half that timed only inferx must not label empty columns as ratios to onnxruntime."""
    from benchmarks.zoo import markdown

    rows = [
        {"model": "m", "system": "inferx-int8", "batch": b, "img_s": 10.0 * b, "p50_ms": 1.0, "rel_error_vs_fp32": 0.0,
         "rounds": [{"img_s": 10.0 * b}] * 3}
        for b in (1, 64)
    ]  # fmt: skip
    record = {"results": rows, "systems": ["inferx-int8"], "target": "h200", "build_only": False, "rounds": 3}
    table = markdown(record | {"builds": []})
    assert "onnxruntime" not in table and "torch-compile" not in table and " vs " not in table.replace("vs fp32", "")
    header, rule, first = table.split("\n")[4:7]
    assert header.count("|") == rule.count("|") == first.count("|") == 8
    assert "Medians of 3 interleaved windows per system." in table


def test_a_system_failing_in_a_later_round_is_recorded_and_the_other_finishes():
    record, log, table = run_measure(3, [100, 300, 200], [100, 110, 120], fail_at=1)
    ours, peer = record["results"]
    assert "illegal memory access" in ours["error"] and "img_s" not in ours
    assert peer["img_s"] == pytest.approx(110) and log.count("torch-compile") == 3
    assert "## Failed runs" in table and "torch-eager b1: RuntimeError: CUDA error" in table


def test_window_end_state_is_summarised_and_garbage_clocks_are_dropped():
    from benchmarks.zoo import summarise_windows
    from inferx_edge.runtime.telemetry import EnergyMeter
    from inferx_edge.runtime.telemetry.base import Sample
    from inferx_edge.runtime.telemetry.replay import ReplayBackend

    samples = [
        Sample(0.0, 500.0, 1000.0, gpu_mhz=1980.0, temp_c=40.0),
        Sample(1.0, 600.0, 1600.0, gpu_mhz=float("nan"), temp_c=52.0, throttle=("sw_power_cap",)),
    ]
    meter = EnergyMeter(ReplayBackend(samples))
    meter.start()
    w = meter.stop()
    # the NaN clock is rejected, so the clock is the last one read; temperature and throttle as the window ended
    assert w["energy_j"] == 600.0 and w["state"] == {"gpu_mhz": 1980.0, "temp_c": 52.0, "throttle": ["sw_power_cap"]}
    assert any("gpu_mhz nan rejected" in r for r in meter.rejected)
    windows = [
        {"fps": f, "p50_ms": 1.0, "p90_ms": 1.0, "j_per_frame": 0.002, "avg_w": 500.0, "state": st}
        for f, st in ((10.0, w["state"]), (30.0, {"gpu_mhz": 1755.0, "temp_c": 60.0, "throttle": []}), (20.0, {}))
    ]
    row = summarise_windows(windows, keep=False)
    assert row["img_s"] == 20.0 and row["mJ_img"] == pytest.approx(2.0) and row["sm_mhz"] == [1755.0, 1980.0]
    assert row["temp_c_max"] == 60.0 and row["throttle"] == ["sw_power_cap"] and "rounds" not in row
