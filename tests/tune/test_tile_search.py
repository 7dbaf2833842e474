"""tune --search tiles: the search records the fastest correct tile, resumes, and compiles at low priority."""

from __future__ import annotations

import json

import numpy as np
import pytest

from inferx_edge.compiler.cuda import tile_candidates
from tests.helpers import fused, needs_nvrtc, quantized_conv


class FakeGPU:
    """Times candidates without a GPU: the n-th measured takes 100 - n us; the third returns different
    outputs; ``stop_at`` raises KeyboardInterrupt at that measurement."""

    name = "fake"

    def __init__(self, stop_at: int | None = None):
        self.calls, self.stop_at = 0, stop_at

    def measure(self, path, host_args, repeat, min_repeat_ms):
        self.calls += 1
        if self.calls == self.stop_at:
            raise KeyboardInterrupt
        after = [a.copy() for a in host_args]
        if self.calls == 3:
            after[-1] = after[-1] + np.ones_like(after[-1])
        return (100 - self.calls) * 1e-6, after

    def close(self):
        pass


@pytest.mark.slow  # 12-90 s on a 2-core host: kept under 15 min by default; run with -m slow
@needs_nvrtc
def test_search_records_the_fastest_correct_tile_and_resumes(tmp_path, monkeypatch):
    import tempfile

    from inferx_edge.compiler.tuning import tile_groups
    from inferx_edge.records.tiles import KERNEL_VERSION, TILES_FILE, load_tiles
    from inferx_edge.targets import get_target
    from inferx_edge.tune.tiles import search_tiles

    spec = get_target("h200")
    scratch = tmp_path / "tmp"  # where the compile workers put candidate libraries
    scratch.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch))
    monkeypatch.setattr(tempfile, "tempdir", None)
    tmp_path = tmp_path / "db"
    mod = fused(quantized_conv(0.01))
    mod2 = fused(quantized_conv(0.01, k=1))
    # two groups in one module: the 3x3 and the 1x1 conv
    mod["conv1x1"] = next(f for gv, f in mod2.functions_items() if gv.name_hint != "main")
    # measured most work (I*J*K) first: the 3x3 conv, then the 1x1 (the module holds them the other way)
    (g1, g3) = tile_groups(mod)
    assert (g3.extents[2], g1.extents[2]) == (9 * 128, 128)
    # interrupted while measuring the second group: the first is kept
    n3 = len(tile_candidates(g3.extents, spec.sm_count, g3.input_padded, deep_stages=True))  # h200: sm_90
    with pytest.raises(KeyboardInterrupt):
        search_tiles(mod, spec, tmp_path, gpu=FakeGPU(stop_at=n3 + 2), workers=2, log=lambda *a: None)
    groups = load_tiles(tmp_path)["groups"]
    assert list(groups) == [g3.key]
    rec = groups[g3.key]
    assert rec["default"] == tile_candidates(g3.extents, spec.sm_count, g3.input_padded, deep_stages=True)[0].text()
    assert "outputs differ" in " ".join(rec["errors"].values())
    assert rec["best"] == min(rec["us"], key=rec["us"].get) and len(rec["us"]) == n3 - 1
    # what else the default tile depends on, for scoring another rule against the record later
    assert rec["shape"] == {"input_padded": True, "weights_along_k": True, "int8": True, "batch": 1}
    # the next run measures only the missing group; a third one measures nothing
    lines = []
    summary = search_tiles(mod, spec, tmp_path, gpu=FakeGPU(), workers=2, log=lines.append)
    assert summary.measured_now == 1 and set(load_tiles(tmp_path)["groups"]) == {g3.key, g1.key}
    assert "1 recorded" in lines[0] and any("[1/1]" in x and "ETA" in x for x in lines)  # progress per group
    assert all(r["best_us"] for r in summary.groups)
    assert search_tiles(mod, spec, tmp_path, gpu=FakeGPU(), log=lambda *a: None).measured_now == 0
    # candidates a newer release adds (here: two forgotten by the record) are measured alone, with the
    # default again as the reference; the record keeps the others' timings
    data = load_tiles(tmp_path)
    rec = data["groups"][g1.key]
    order = [c.text() for c in tile_candidates(g1.extents, spec.sm_count, g1.input_padded, deep_stages=True)]
    dropped = [t for t in order[1:] if t in rec["us"]][:2]  # in the order they are measured
    kept = {t: us for t, us in rec["us"].items() if t not in dropped}
    data["groups"][g1.key] = {**rec, "us": kept}
    (tmp_path / TILES_FILE).write_text(json.dumps(data))
    gpu, lines = FakeGPU(), []
    assert search_tiles(mod, spec, tmp_path, gpu=gpu, workers=2, log=lines.append).measured_now == 1
    assert gpu.calls == 3 and "1 recorded ones only for candidates added since" in lines[0]
    after = load_tiles(tmp_path)["groups"][g1.key]  # FakeGPU's third run (the second new one) differs
    assert dropped[0] in after["us"] and "outputs differ" in after["errors"][dropped[1]]
    assert all(after["us"][t] == us for t, us in kept.items() if t != rec["default"])
    assert after["best"] == min(after["us"], key=after["us"].get)
    # a group timed with older kernels (no kernel_version: before the cp.async rewrite) is measured
    # again in full, the other is left alone
    data = load_tiles(tmp_path)
    assert {r["kernel_version"] for r in data["groups"].values()} == {KERNEL_VERSION}
    del data["groups"][g1.key]["kernel_version"]
    (tmp_path / TILES_FILE).write_text(json.dumps(data))
    gpu, lines = FakeGPU(), []
    assert search_tiles(mod, spec, tmp_path, gpu=gpu, workers=2, log=lines.append).measured_now == 1
    assert gpu.calls == len(order) and "1 timed with older kernels" in lines[0]
    assert load_tiles(tmp_path)["groups"][g1.key]["kernel_version"] == KERNEL_VERSION
    # a corrupt file is moved aside with a warning, not fatal, and measured again
    (tmp_path / TILES_FILE).write_text('{"format": 1, "groups": {')
    warnings = []
    assert load_tiles(tmp_path, warn=warnings.append, repair=False) == {} and warnings  # build: only reads
    assert (tmp_path / TILES_FILE).exists()
    assert load_tiles(tmp_path, warn=warnings.append) == {} and len(warnings) == 2
    assert (tmp_path / (TILES_FILE + ".corrupt")).exists()
    # every candidate library was deleted once timed, or when an interrupted run stopped
    assert not list(scratch.glob("inferx_tile_*"))


class _InlinePool:
    """Stands in for the compile pool: every job "compiles" at once to a path naming the job."""

    def __init__(self, **_kw):
        self.submitted = []

    def submit(self, _fn, _func, text, *_args):
        from concurrent.futures import Future

        self.submitted.append(text)
        fut = Future()
        fut.set_result(f"/nonexistent/inferx-tile-{len(self.submitted)}/lib.so")
        return fut

    def shutdown(self):
        pass


class _ClockGPU:
    """Times a group's candidates by its operands' size (the smaller group is the slower) and moves a
    fake clock 10 s per measurement."""

    name = "fake"

    def __init__(self, clock):
        self.clock, self.paths = clock, []

    def measure(self, path, host_args, repeat, min_repeat_ms):
        self.clock.now += 10.0
        self.paths.append(path)
        return 1.0 / sum(a.size for a in host_args), [a.copy() for a in host_args]

    def close(self):
        pass


def test_a_timed_search_measures_the_slowest_kernels_first(tmp_path, monkeypatch):
    """With --minutes each group's default tile is timed first and the groups are searched slowest
    first (not most work first); the timed default is reused, not compiled again; a search stopped by
    the time limit has recorded the slowest group."""
    import tvm.support.popen_pool as popen_pool

    from inferx_edge.compiler.tuning import tile_groups
    from inferx_edge.records.tiles import load_tiles
    from inferx_edge.targets import get_target
    from inferx_edge.tune import tile_jobs, tiles

    class Clock:
        now = 1000.0

        def time(self):
            return self.now

    clock = Clock()
    pools = []
    monkeypatch.setattr(popen_pool, "PopenPoolExecutor", lambda **kw: pools.append(_InlinePool(**kw)) or pools[-1])
    monkeypatch.setattr(tiles, "time", clock)
    monkeypatch.setattr(tile_jobs, "time", clock)
    spec = get_target("h200")
    mod = fused(quantized_conv(0.01))
    mod["conv1x1"] = next(f for gv, f in fused(quantized_conv(0.01, k=1)).functions_items() if gv.name_hint != "main")
    g1, g3 = tile_groups(mod)  # the 1x1 conv: 9x less work, and slower on this fake GPU
    n1, n3 = (len(tile_candidates(g.extents, spec.sm_count, g.input_padded, deep_stages=True)) for g in (g1, g3))
    gpu, lines = _ClockGPU(clock), []
    # two defaults timed (20 s), then the slowest group's n1 candidates; the limit stops the other
    limit = 20 + 10 * n1 - 5
    summary = tiles.search_tiles(mod, spec, tmp_path, minutes=limit / 60, gpu=gpu, workers=1, log=lines.append)
    assert summary.stopped_by_time and summary.measured_now == 1
    assert list(load_tiles(tmp_path)["groups"]) == [g1.key]
    assert any("timed each group's default tile (2 groups" in x for x in lines)
    # the defaults are timed in work order (the 3x3's, then the 1x1's); the 1x1's was compiled once,
    # timed to order the groups and again as its search's reference
    assert gpu.paths[2] == gpu.paths[1] != gpu.paths[0] and len(gpu.paths) == 2 + n1
    assert len(pools[0].submitted) == 2 + (n1 - 1) + (n3 - 1)
    # timing the defaults may take a quarter of the limit: past it (here after the first default, 10 s
    # of 30) the groups left follow in work order, their compiled defaults reused
    clock.now, gpu.paths = 1000.0, []
    (tmp_path / "short").mkdir()
    tiles.search_tiles(mod, spec, tmp_path / "short", minutes=0.5, gpu=gpu, workers=1, log=lambda *a: None)
    assert list(load_tiles(tmp_path / "short")["groups"]) == [g3.key] and len(gpu.paths) == 1 + n3
    assert len(pools[-1].submitted) == 2 + (n1 - 1) + (n3 - 1)
    # without a time limit the order is by work and nothing is timed twice
    clock.now, gpu.paths = 1000.0, []
    (tmp_path / "again").mkdir()
    tiles.search_tiles(mod, spec, tmp_path / "again", gpu=gpu, workers=1, log=lambda *a: None)
    assert list(load_tiles(tmp_path / "again")["groups"]) == [g3.key, g1.key] and len(gpu.paths) == n1 + n3


def test_tile_search_needs_a_cuda_tensor_core_variant():
    from inferx_edge.errors import UsageError
    from inferx_edge.models import DEFAULT_MODEL
    from inferx_edge.tune import TuneOptions

    with pytest.raises(UsageError, match="CUDA target and --precision fp16, int8, mixed"):
        TuneOptions(model=DEFAULT_MODEL, target="x86-cpu", precision="int8", search="tiles")
    with pytest.raises(UsageError, match="CUDA target and --precision fp16, int8, mixed"):
        TuneOptions(model=DEFAULT_MODEL, target="h200", precision="fp32", search="tiles")
    assert TuneOptions(model=DEFAULT_MODEL, target="h200", precision="fp16", search="tiles").search == "tiles"
    # the earlier name of the search still works
    assert TuneOptions(model=DEFAULT_MODEL, target="h200", precision="int8", search="int8-tiles").search == "tiles"
    with pytest.raises(UsageError, match="valid: metaschedule, tiles, int8-tiles"):
        TuneOptions(model=DEFAULT_MODEL, target="h200", precision="int8", search="random")


def test_fp16_outputs_match_within_tolerance_int8_exactly():
    from inferx_edge.tune.tiles import FP16_MATCH, _same

    rng = np.random.default_rng(0)
    ref = rng.uniform(0, 300, (64, 64)).astype(np.float16)
    close = (ref.astype(np.float32) * (1 + rng.uniform(-1e-3, 1e-3, ref.shape))).astype(np.float16)
    assert _same([close], [ref])  # another accumulation order
    off = ref.copy()
    off[3, 5] += np.float16(FP16_MATCH * 2 * np.abs(ref).max())  # a missing or doubled term
    assert not _same([off], [ref])
    nan = ref.copy()
    nan[0, 0] = np.nan
    assert not _same([nan], [ref])
    q = rng.integers(-128, 128, (8, 8)).astype(np.int8)
    q2 = q.copy()
    q2[0, 0] ^= 1
    assert _same([q], [q.copy()]) and not _same([q2], [q])


def test_compile_workers_run_at_lower_priority_and_the_caller_can_keep_its_own():
    """Tile candidates compile in pool workers while the parent times others on the GPU; a worker
    lowers its priority once (the CUDA compiler it spawns inherits it) unless told not to."""
    import subprocess
    import sys

    code = (
        "import os\n"
        "from tvm import te\n"
        "from inferx_edge.tune import tile_jobs\n"
        "a = te.placeholder((4,), 'float32', name='a')\n"
        "copy = te.create_prim_func([a, te.compute((4,), lambda i: a[i], name='b')])\n"  # no GEMM: no tile applies
        "start = os.nice(0)\n"
        "args = (copy, '2x4.2x4.k4.v16.mma', 'cuda', 'h200', None)\n"
        "assert tile_jobs.compile_candidate(*args, False) is None and os.nice(0) == start\n"
        "assert tile_jobs.compile_candidate(*args) is None and tile_jobs.compile_candidate(*args) is None\n"
        "print(start, os.nice(0))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    from inferx_edge.tune.tile_jobs import COMPILE_NICENESS

    start, after = (int(x) for x in out.stdout.split()[-2:])
    assert after == min(start + COMPILE_NICENESS, 19)  # once, however often it compiles
