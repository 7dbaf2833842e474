"""GridFallback (compiler/cuda/rules/grid_fallback.py): dlight's generic schedule with the outer output
axes on blockIdx.y, for kernels whose Fallback schedule fails code generation."""

from __future__ import annotations

import pytest


def _kernels():
    """Unscheduled PrimFuncs: a 3-D elementwise add, a concatenation along a middle axis, a row sum, a
    1-D add (one spatial axis) and one whose outer axes exceed gridDim.y."""
    from tvm import te, tirx

    a = te.placeholder((2, 37, 300), name="a")
    b = te.placeholder((2, 5, 300), name="b")
    add = te.compute(a.shape, lambda i, j, k: a[i, j, k] + 1.0, name="add")
    cat = te.compute(
        (2, 42, 300), lambda i, j, k: tirx.if_then_else(j < 37, a[i, tirx.min(j, 36), k], b[i, j - 37, k]), name="cat"
    )
    r = te.reduce_axis((0, 300), name="r")
    total = te.compute((2, 37), lambda i, j: te.sum(a[i, j, r], axis=r), name="total")
    v = te.placeholder((5000,), name="v")
    flat = te.compute(v.shape, lambda i: v[i] * 2.0, name="flat")
    wide = te.placeholder((70000, 3, 2), name="wide")
    tall = te.compute(wide.shape, lambda i, j, k: wide[i, j, k] - 1.0, name="tall")
    return {
        "add": te.create_prim_func([a, add]),
        "cat": te.create_prim_func([a, b, cat]),
        "total": te.create_prim_func([a, total]),
        "flat": te.create_prim_func([v, flat]),
        "tall": te.create_prim_func([wide, tall]),
    }


@pytest.mark.parametrize("name", ["add", "cat", "total", "flat", "tall"])
def test_schedules_compute_what_the_kernel_computes(name):
    """Run on this CPU with the thread loops serial: the same values as the unscheduled kernel."""
    import tvm

    from inferx_edge.compiler.cuda.rules.grid_fallback import grid_fallback_rule
    from inferx_edge.compiler.schedule_check import check_kernel

    func = _kernels()[name]
    target = tvm.target.Target({"kind": "cuda", "arch": "sm_90"})
    with target:
        sch = grid_fallback_rule().apply(func, target, False)
    scheduled = sch.mod["main"]
    assert check_kernel(func, scheduled) < 1e-6
    text = scheduled.script()
    if name in ("flat", "tall"):  # one spatial axis / 70000 rows: Fallback's own 1-D grid
        assert "blockIdx.y" not in text and "blockIdx.x" in text
    else:
        assert "blockIdx.y" in text and "blockIdx.x" in text and "threadIdx.x" in text


def test_the_pipeline_ends_with_it_and_the_build_retries_into_it(monkeypatch, tmp_path):
    """A kernel whose Fallback schedule fails code generation (a Fallback that writes int32x16 here)
    compiles under GridFallback on the build's retry; the record lists both fallbacks."""
    from tests.helpers import nvrtc12_available

    if not nvrtc12_available():
        pytest.skip("needs NVRTC 12")
    from tvm.s_tir import dlight

    from inferx_edge.compiler import compile as compile_mod
    from inferx_edge.compiler.variant import PreparedVariant, variant_layout
    from inferx_edge.targets import get_target
    from tests.compiler.test_guarded_schedule import _SixteenLanes, int32_add_module

    class BrokenFallback(_SixteenLanes):
        name = "Fallback"

    Mod = int32_add_module()
    from inferx_edge.compiler.cuda import pipeline

    monkeypatch.setattr(pipeline, "vectorized_elementwise_rule", _SixteenLanes)
    monkeypatch.setattr(dlight.gpu, "Fallback", BrokenFallback)
    assert compile_mod.LAST_RULE == "GridFallback"
    spec = get_target("h200")
    prepared = PreparedVariant(Mod, variant_layout(spec, "fp32"), None, [], None, None, None)
    record = compile_mod.compile_variant(prepared, spec, tmp_path / "lib.so")
    assert (tmp_path / "lib.so").stat().st_size > 0
    rules = [e["rule"] for e in record["schedule_fallbacks"]]
    assert rules == ["SixteenLanes", "Fallback"]
    assert all("int32x16" in e["error"] for e in record["schedule_fallbacks"])
