"""The twin against the published figures it can be checked with, printed by ``profile --twin`` and
recorded by ``benchmarks/twin_governor.py``.

- Power: the GPU and CPU rail anchors of :mod:`inferx_edge.twin.power` with the fit's error.
- Speed: ResNet-50 int8 on AGX Orin 64 GB in MLPerf Inference v3.0 (closed, edge, TensorRT 8.5.2):
  MaxP offline 6,438 img/s with GPU + 2 DLAs, of which the GPU ~4,500 (NVIDIA's config); MaxQ clocks
  (4 CPUs at 576 MHz, GPU 624.75 MHz, EMC 2133 MHz) 3,463 img/s at ~22.6 W wall. The twin predicts our
  own int8 ResNet-50 (batch 64, from the H200 kernel profile) in MAXN and at the MaxQ clocks. Ours is
  not TensorRT and runs no DLA, so only the MaxQ/MaxP ratio is a like-for-like check; the absolute
  numbers are shown for scale.
"""

from __future__ import annotations

from inferx_edge.twin import power
from inferx_edge.twin.boards import PowerMode, get_board

MLPERF_MAXP_FPS, MLPERF_MAXP_GPU_FPS, MLPERF_MAXQ_FPS, MLPERF_MAXQ_WALL_W = 6438.0, 4500.0, 3463.0, 22.6
MAXQ = PowerMode(-1, "MLPerf-MaxQ", 4, 576.0, 624.75, 8, 2133.0)


def speed_check() -> dict:
    from inferx_edge.twin.simulate import gpu_activity  # the simulator's power model
    from inferx_edge.twin.zoo import reference_variants

    board = get_board("jetson-agx-orin-64gb")
    v = next(x for x in reference_variants("resnet50") if x.precision == "int8" and x.batch == 64)
    maxn, maxq = v.latency.on(board, board.mode(0)), v.latency.on(board, MAXQ)
    fps_maxn, fps_maxq = 64e3 / maxn["ms"], 64e3 / maxq["ms"]
    w_maxq = power.module_power(board, MAXQ, gpu_activity(maxq), 0.25, maxq["mem_util"]).total_w
    return {
        "resnet50_int8_b64_maxn_fps": fps_maxn,
        "resnet50_int8_b64_maxq_fps": fps_maxq,
        "maxq_over_maxn": fps_maxq / fps_maxn,
        "mlperf_maxq_over_maxp": MLPERF_MAXQ_FPS / MLPERF_MAXP_FPS,
        "maxn_over_mlperf_gpu_only": fps_maxn / MLPERF_MAXP_GPU_FPS,
        "maxq_module_w": w_maxq,
        "maxq_mj_per_img": w_maxq / fps_maxq * 1e3,
        "mlperf_maxq_wall_mj_per_img": MLPERF_MAXQ_WALL_W / MLPERF_MAXQ_FPS * 1e3,
    }


def report() -> list[str]:
    lines = power.calibration_report()
    s = speed_check()
    lines += [
        "speed, AGX Orin 64 GB, ResNet-50 int8 batch 64 (ours, from the H200 kernel profile):",
        f"  MAXN {s['resnet50_int8_b64_maxn_fps']:.0f} img/s ({s['maxn_over_mlperf_gpu_only']:.2f}x MLPerf v3.0's GPU share "
        f"{MLPERF_MAXP_GPU_FPS:.0f}, TensorRT)",
        f"  MaxQ clocks {s['resnet50_int8_b64_maxq_fps']:.0f} img/s: MaxQ/MAXN {s['maxq_over_maxn']:.2f} against MLPerf's "
        f"{s['mlperf_maxq_over_maxp']:.2f} (GPU + 2 DLA: {s['maxq_over_maxn'] / s['mlperf_maxq_over_maxp'] - 1:+.0%})",
        f"  MaxQ module {s['maxq_module_w']:.1f} W, {s['maxq_mj_per_img']:.1f} mJ/img against MLPerf's "
        f"{s['mlperf_maxq_wall_mj_per_img']:.1f} mJ/img at the wall with DLAs",
    ]
    return lines
