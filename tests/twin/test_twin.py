"""The Jetson twin: its sysfs tree and nvpmodel read and driven by the unmodified backends and control
path, its calibration against the published figures, its latency model, and a short trace where the
governor's choice is known in advance."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from inferx_edge.twin.boards import BOARDS, get_board
from inferx_edge.twin.device import TwinDevice

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="the control path refuses power-mode changes without root")


@pytest.mark.parametrize("name", sorted(BOARDS))
def test_the_real_backend_reads_the_twins_tree(name, tmp_path):
    from inferx_edge.runtime.telemetry.jetson import JetsonSysfsBackend, current_power_mode, power_modes

    board = get_board(name)
    twin = TwinDevice(board, tmp_path)
    backend = JetsonSysfsBackend(tmp_path, clock=twin.clock)
    assert backend.partial == (board.total_rail is None)  # AGX Orin has no module-input rail
    idle = backend.read().power_w
    twin.advance(2.0, gpu_util=0.9, cpu_util=0.2)
    s = backend.read()
    assert s.t == pytest.approx(2.0) and s.power_w > idle and s.gpu_util == pytest.approx(90.0)
    assert s.gpu_mhz == pytest.approx(board.clocks(board.mode(board.default_mode))["gpu_mhz"], abs=0.01)
    assert set(s.rails_w) == set(board.rails)
    # the rails add up to the twin's energy over the window (mA x mV rounding aside)
    assert s.power_w == pytest.approx(twin.last_power.total_w, rel=0.01)
    modes, default = power_modes(tmp_path)
    assert [(m.id, m.name) for m in modes] == [(m.id, m.name) for m in board.modes] and default == board.default_mode
    assert current_power_mode(twin.nvpmodel).id == board.default_mode


@needs_root
def test_mode_switch_through_nvpmodel_takes_the_published_delay(tmp_path):
    from inferx_edge.errors import ControlError, UsageError
    from inferx_edge.runtime.control import PowerModeSweep, set_power_mode
    from inferx_edge.runtime.telemetry.jetson import JetsonSysfsBackend, current_power_mode

    board = get_board("jetson-agx-orin-64gb")
    twin = TwinDevice(board, tmp_path, mode_id=0)  # MAXN: 12 cores
    backend = JetsonSysfsBackend(tmp_path, clock=twin.clock)
    set_power_mode(1, allowed=True, nvpmodel=twin.nvpmodel, root=str(tmp_path))  # MODE_15W: 4 cores, EMC cap
    delay = twin.switch_delay(board.mode(0), board.mode(1))
    assert delay == pytest.approx(0.008 + 8 * 0.020)  # EMC actuation + 8 cores hot-plugged
    twin.advance(delay / 2, gpu_util=1.0)
    assert twin.mode.id == 0 and backend.read().gpu_mhz == pytest.approx(1300.5)
    twin.advance(delay, gpu_util=1.0)
    assert twin.mode.id == 1 and backend.read().gpu_mhz == pytest.approx(408.0)
    assert (tmp_path / "sys/devices/system/cpu/cpu4/online").read_text().strip() == "0"
    assert current_power_mode(twin.nvpmodel).name == "MODE_15W"
    assert twin.switches[0]["effective_s"] - twin.switches[0]["requested_s"] == pytest.approx(delay)
    with pytest.raises(UsageError, match="unknown power mode 7"):
        set_power_mode(7, allowed=True, nvpmodel=twin.nvpmodel, root=str(tmp_path))
    with PowerModeSweep(allowed=True, nvpmodel=twin.nvpmodel, root=str(tmp_path)) as set_mode:
        set_mode(2)
        twin.advance(1.0)
        assert twin.mode.id == 2
    twin.advance(1.0)
    assert twin.mode.id == 1  # the sweep restored the mode it found
    bad = tmp_path / "broken-nvpmodel"
    bad.write_text("#!/bin/sh\necho 'NVPM ERROR' >&2\nexit 1\n")
    bad.chmod(0o755)
    with pytest.raises(ControlError, match="failed"):
        set_power_mode(1, allowed=True, nvpmodel=str(bad), root=str(tmp_path))


def test_calibration_against_the_published_figures():
    from inferx_edge.twin import calibrate, power

    errors = power.calibration_errors()
    assert max(abs(e) for e in errors["gpu_rail"]) < 0.10
    s = calibrate.speed_check()
    # MLPerf v3.0 MaxQ / MaxP (GPU + 2 DLA) is 0.54; the twin's GPU-only prediction lands within 15 %
    assert s["maxq_over_maxn"] == pytest.approx(s["mlperf_maxq_over_maxp"], rel=0.15)
    assert 2.0 < s["maxq_mj_per_img"] < 15.0  # MLPerf MaxQ: 6.5 mJ/img at the wall
    assert any("published" in line for line in calibrate.report())


def _synthetic_profile(path, kernels, e2e_ms, precision="int8", batch=1):
    rows = [{"kernel": n, "calls_per_run": 1, "ms_per_run": ms, "flops": f, "bytes": b} for n, ms, f, b in kernels]
    path.write_text(
        json.dumps({"precision": precision, "input_shapes": {"x": [batch, 3, 8, 8]}, "e2e_ms": e2e_ms, "kernels": rows})
    )
    return path


def test_latency_scales_by_the_bound_of_each_kernel(tmp_path):
    from inferx_edge.twin.latency import H200, LatencyModel

    board = get_board("jetson-agx-orin-64gb")
    rate = H200.attainable_int8_tops * 1e12 / H200.sms  # ops/s of one SM at the reference clock
    maxn, low = board.mode(0), board.mode(1)  # MAXN, 15W (3 TPCs, 408 MHz, EMC 2133)
    # a kernel that keeps all 132 SMs busy for 1 ms: scaled by SMs x clock
    big = _synthetic_profile(tmp_path / "big.json", [("conv", 1.0, rate * 132 * 1e-3, 1e3)], 1.0)
    t = LatencyModel.from_profile(big).on(board, maxn)
    assert t["gpu_ms"] == pytest.approx((132 * 1980.0) / (16 * 1300.5), rel=1e-6)
    # one that keeps 4 SMs busy: only the clock ratio applies (Orin has 16)
    small = _synthetic_profile(tmp_path / "small.json", [("conv", 1.0, rate * 4 * 1e-3, 1e3)], 1.0)
    assert LatencyModel.from_profile(small).on(board, maxn)["gpu_ms"] == pytest.approx(1980.0 / 1300.5, rel=1e-6)
    # a memory-bound one (4 TB/s on the H200): limited by the mode's DRAM bandwidth, and so by its EMC clock
    mem = _synthetic_profile(tmp_path / "mem.json", [("copy", 1.0, 1.0, 4e9)], 1.0)
    lm = LatencyModel.from_profile(mem)
    full, capped = lm.on(board, maxn), lm.on(board, low)
    assert full["gpu_ms"] == pytest.approx(4e9 / (0.9 * 204.8e9) * 1e3, rel=1e-6)
    assert capped["gpu_ms"] / full["gpu_ms"] == pytest.approx(3199.0 / 2133.0, rel=1e-6)
    assert full["memory_bound_ms"] == pytest.approx(full["gpu_ms"])


def test_the_governor_picks_what_the_oracle_picks_on_a_short_trace():
    """ResNet-50 on Orin Nano at 30 % of capacity: the 7W mode cannot keep up with batch 1 and the 15W
    mode's batch-8 point is cheapest; known in advance from the oracle over the same trace."""
    from inferx_edge.twin.simulate import Simulation, steady
    from inferx_edge.twin.zoo import reference_variants

    board = get_board("jetson-orin-nano-8gb")
    variants = [v for v in reference_variants("resnet50") if v.precision == "int8"]
    probe = Simulation(board, variants, steady(10, 5), 50.0)
    fast = probe.fastest_point()
    lat = probe.table.service_s(probe.table.variant_for(fast.precision, fast.batch).name, board.mode(fast.mode))
    cap = fast.batch / lat
    sim = Simulation(board, variants, steady(0.3 * cap, 40), 3 * lat * 1e3, oracle_interval_s=40)
    oracle, gov = sim.oracle(), sim.governor()
    settled = {x["point"] for x in gov.timeline[-20:]}
    assert settled == {oracle.timeline[-1]["point"]}, (settled, oracle.timeline[-1]["point"])
    assert gov.miss_rate <= 0.01 and gov.j_per_inference <= 1.05 * oracle.j_per_inference
    base = sim.maxn_fastest()
    assert gov.j_per_inference < base.j_per_inference


def test_profile_twin_writes_a_predicted_profile_that_report_labels(tmp_path):
    import numpy as np

    from inferx_edge import models
    from inferx_edge.quantize.driver import QuantOptions
    from tests.helpers import build_quietly, cli

    model = tmp_path / "resnet50.onnx"  # a model the twin has reference profiles for, by name
    shutil.copy(models.DEFAULT_MODEL, model)
    calib = tmp_path / "calib.npy"
    np.save(calib, np.random.default_rng(0).random((16, 1, 28, 28), dtype=np.float32))
    art = build_quietly(
        tmp_path / "r.ixa", model=model, precisions=("int8",), batch_sizes=(1, 8), quant=QuantOptions(calib=calib)
    )
    out = tmp_path / "twin.json"
    r = cli("profile", art, "--twin", "jetson-orin-nano-8gb", "-o", out)
    assert r.returncode == 0, r.stderr
    prof = json.loads(out.read_text())
    assert prof["predicted"] is True and prof["twin"] == "jetson-orin-nano-8gb"
    assert {v["name"] for v in prof["variants"]} == {"int8-b1@15W", "int8-b8@15W", "int8-b1@7W", "int8-b8@7W"}
    assert all(v["fps"] > 0 and v["avg_w"] > 0 for v in prof["variants"])
    r = cli("report", out, "-o", tmp_path / "rep")
    assert r.returncode == 0, r.stderr
    md = (tmp_path / "rep" / "report.md").read_text()
    assert md.splitlines()[0].endswith("PREDICTED ON A TWIN (JETSON-ORIN-NANO-8GB), NOT MEASURED")
    assert md.count("predicted on a twin") >= 3  # note, variants table, policy picks
    assert "PREDICTED ON A TWIN" in (tmp_path / "rep" / "report.html").read_text()
    r = cli("profile", art, "--twin", "jetson-xavier", "-o", out)
    assert r.returncode != 0 and "jetson-agx-orin-64gb" in r.stderr


def test_work_that_outlasts_a_step_is_accounted_where_it_runs():
    """Energy of a static point is the same whether a window is simulated whole or in ten steps (batch
    runs longer than a step carry their work over instead of being clipped)."""
    from inferx_edge.twin.simulate import Simulation, steady
    from inferx_edge.twin.zoo import reference_variants

    board = get_board("jetson-orin-nano-8gb")
    variants = [v for v in reference_variants("resnet50") if v.precision == "int8"]
    sim = Simulation(board, variants, steady(600, 20), 200.0)
    p = sim.fastest_point()
    whole, steps = (sim.run_schedule("x", lambda k, last: p, steps=n) for n in (1, 10))
    assert steps.requests == pytest.approx(whole.requests, rel=0.01)
    assert steps.energy_j == pytest.approx(whole.energy_j, rel=0.005)
