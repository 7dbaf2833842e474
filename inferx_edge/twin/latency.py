"""Variant latency on a twin board's power mode, from our own per-kernel measurements on a reference GPU.

Input: a kernel profile of the variant (``scripts/kernel_profile.py --json``: per kernel, calls and ms
per run, synchronized around every call) measured on the reference GPU, and each kernel's FLOPs and
compulsory bytes (``--costs-only`` of the same model, precision and batch, or the same profile run,
which records both). Model, per kernel k:

- its work time on the reference: the uninstrumented end-to-end time shared among the GPU kernels in
  proportion to their instrumented times (each row carries a sync and a launch; the VM's host-side
  builtins overlap with the GPU's work because launches are asynchronous);
- what it achieved on the reference: compute rate R_c = FLOPs / work and bandwidth R_m = bytes / work;
  R_c / (per-SM attainable rate x clock) is how many SMs it kept busy (n_ref, at most all of them:
  a batch-1 kernel with a small grid keeps few busy). P_ref per SM: 759 int8 TOPS (our 4096^3 GEMM on
  the H200) / 132 SMs / 1980 MHz, half that for fp16;
- on the board: it keeps n = min(n_ref, SMs of the mode) busy at the mode's GPU clock, and cannot move
  more than 90 % of the mode's DRAM bandwidth (EMC clock): t = work * max((n_ref f_ref) / (n f),
  R_m / min(R_m, 0.9 BW)), i.e. a kernel keeps its per-SM efficiency, and whichever of compute and
  memory runs out first sets its time;
- the host's part: every VM call (kernel launches and builtins) at ``host_us_per_call`` on the
  reference host, scaled by CPU clock; a run takes max(GPU time, host time) (the host runs ahead of
  the GPU while the GPU is the bottleneck, and starves it when it is not).

Assumptions (said wherever a twin number is shown): our kernels use ``mma.sync`` tensor-core
instructions, whose per-SM per-clock rate is the same on GA10B (Orin, Ampere) as on GH100 (4096 int8
ops/clk/SM; Hopper's higher rate needs ``wgmma``, which these kernels do not use); memory-bound
kernels reach the same fraction of DRAM bandwidth on LPDDR5 as on HBM3e; host overhead scales with
CPU clock only (an A78AE core at 2.2 GHz is taken as a 3.0 GHz x86 core at 2.2 / 3.0 the speed, IPC
differences ignored).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from inferx_edge.errors import UsageError
from inferx_edge.twin.boards import Board, PowerMode


@dataclass(frozen=True)
class ReferenceGPU:
    name: str
    sms: int
    mhz: float  # SM clock under load while the profile ran
    mem_gbps: float
    attainable_int8_tops: float  # the best our int8 kernels reach on it
    attainable_fp16_tflops: float
    host_ghz: float
    host_us_per_call: float  # one VM call (launch or builtin) on the reference host


#: H200 SXM: 132 SMs, boost 1980 MHz (NVML during our runs), 4.8 TB/s HBM3e; 759 TOPS is our 4096^3
#: int8 GEMM (benchmarks/results/gpu_int8_matmul_h200_tiles6.json); fp16 at half the int8 rate
#: (*assumption*: mma.sync fp16 is half of int8 per clock, as on Ampere)
#: (*assumption*: 2 us per VM call on the x86 host, TVM's VM dispatch plus a launch)
H200 = ReferenceGPU("NVIDIA H200", 132, 1980.0, 4800.0, 759.0, 379.5, 3.0, 2.0)


@dataclass(frozen=True)
class KernelRow:
    name: str
    calls: int
    ms: float  # per run, as profiled (with one sync + launch per call)
    flops: float | None
    bytes: float | None
    host: bool  # a VM builtin (host side), not a GPU kernel


def load_kernel_profile(path: Path, costs: Path | None = None) -> tuple[dict, list[KernelRow]]:
    """A ``kernel_profile.py --json`` record, with FLOPs/bytes from ``costs`` (``--costs-only``) when the
    profile does not carry them. Kernels without costs are scaled as compute-bound (noted)."""
    try:
        doc = json.loads(Path(path).read_text())
        rows_in = doc["kernels"]
    except (OSError, ValueError, KeyError) as exc:
        raise UsageError(f"{path} is not a kernel profile (scripts/kernel_profile.py --json): {exc}") from exc
    extra = {}
    if costs is not None:
        try:
            extra = json.loads(Path(costs).read_text())["kernels"]
        except (OSError, ValueError, KeyError) as exc:
            raise UsageError(f"{costs} is not a kernel cost file (kernel_profile.py --costs-only): {exc}") from exc
    rows = []
    for r in rows_in:
        c = extra.get(r["kernel"], {})
        rows.append(
            KernelRow(
                r["kernel"],
                int(r.get("calls_per_run", 1)),
                float(r["ms_per_run"]),
                r.get("flops", c.get("flops")),
                r.get("bytes", c.get("bytes")),
                r["kernel"].startswith("vm.builtin"),
            )
        )
    return doc, rows


@dataclass(frozen=True)
class LatencyModel:
    """A variant's kernels on the reference GPU, ready to be placed on a board mode."""

    precision: str
    batch: int
    e2e_ms: float
    rows: tuple[KernelRow, ...]
    reference: ReferenceGPU = H200

    @classmethod
    def from_profile(cls, path: Path, costs: Path | None = None, reference: ReferenceGPU = H200) -> LatencyModel:
        doc, rows = load_kernel_profile(path, costs)
        shape = next(iter(doc.get("input_shapes", {}).values()), [1])
        return cls(doc.get("precision", "fp32"), int(shape[0]), float(doc["e2e_ms"]), tuple(rows), reference)

    def per_sm_rate(self) -> float:
        """Attainable ops per SM per MHz-second on the reference (ops/s = this * SMs * MHz * 1e6)."""
        ref = self.reference
        tops = ref.attainable_int8_tops if self.precision in ("int8", "mixed") else ref.attainable_fp16_tflops
        return tops * 1e12 / (ref.sms * ref.mhz * 1e6)

    def split(self) -> list[dict]:
        """Per GPU kernel: work ms on the reference, SMs it kept busy, bandwidth it moved."""
        ref = self.reference
        gpu = [r for r in self.rows if not r.host]
        share = self.e2e_ms / max(sum(r.ms for r in gpu), 1e-12)
        rate = self.per_sm_rate()
        out = []
        for r in gpu:
            work_s = r.ms * share / 1e3
            if r.flops:
                n_ref = min(float(ref.sms), r.flops / work_s / (rate * ref.mhz * 1e6))
            else:
                n_ref = float(ref.sms)  # no FLOP count: taken as filling the GPU
            bw = (r.bytes or 0.0) / work_s
            out.append({"row": r, "work_ms": work_s * 1e3, "sms_busy": n_ref, "bytes_per_s": bw})
        return out

    def on(self, board: Board, mode: PowerMode) -> dict:
        """Predicted latency (ms) of one run in ``mode``, with the parts it is made of."""
        ref = self.reference
        c = board.clocks(mode)
        s_c = (ref.sms * ref.mhz) / (c["sms"] * c["gpu_mhz"])
        host_scale = ref.host_ghz / (c["cpu_mhz"] / 1000.0)  # host work by CPU clock only
        gpu_ms = mem_ms = sm_ms = 0.0
        bw_board = 0.9 * board.mem_gbps_at(c["emc_mhz"]) * 1e9
        for k in self.split():
            n = min(k["sms_busy"], c["sms"])
            compute = (k["sms_busy"] * ref.mhz) / (n * c["gpu_mhz"]) if n > 0 else s_c
            memory = k["bytes_per_s"] / min(k["bytes_per_s"], bw_board) if k["bytes_per_s"] > 0 else 1.0
            scaled = k["work_ms"] * max(compute, memory)
            gpu_ms += scaled
            sm_ms += scaled * n / c["sms"]
            if memory > compute:
                mem_ms += scaled
        calls = sum(r.calls for r in self.rows)
        host_ms = calls * ref.host_us_per_call * 1e-3 * host_scale
        total = max(gpu_ms, host_ms)
        return {
            "ms": total,
            "gpu_ms": gpu_ms,
            "memory_bound_ms": mem_ms,
            "host_ms": host_ms,
            "gpu_util": gpu_ms / total if total else 0.0,
            "sm_activity": sm_ms / gpu_ms if gpu_ms else 0.0,  # share of the mode's SMs its kernels keep busy
            "mem_util": min(1.0, mem_ms / total) if total else 0.0,
            "scale_compute_full_gpu": s_c,
        }
