"""A schedule rule that raises on a kernel hands it to the next rule; the build record says so."""

from __future__ import annotations

import pytest


def _matmul_module():
    import tvm
    from tvm import relax
    from tvm.script import relax as R

    @tvm.script.ir_module
    class Mod:
        @R.function
        def main(x: R.Tensor((4, 32), "float32"), w: R.Tensor((32, 16), "float32")):
            with R.dataflow():
                y = R.nn.relu(R.matmul(x, w))
                R.output(y)
            return y

    from inferx_edge.compiler.cuda.pipeline import fusion_passes

    return tvm.transform.Sequential(fusion_passes())(Mod), relax


class _Raises:
    name = "Exploding"

    def apply(self, func, target, tunable):
        raise AssertionError("this rule cannot schedule that kernel")


class _Declines:
    def apply(self, func, target, tunable):
        return None


@pytest.mark.parametrize("first", [_Raises, _Declines])
def test_a_failing_rule_passes_the_kernel_to_the_next_one(first):
    import tvm
    from tvm.s_tir import dlight as dl

    from inferx_edge.compiler.guarded_schedule import SCHEDULE_RULE_ATTR, FallbackLog, guarded_default_schedule

    mod, _ = _matmul_module()
    target = tvm.target.Target({"kind": "cuda", "arch": "sm_90"})
    with FallbackLog() as log, target:
        out = guarded_default_schedule(first(), dl.gpu.Fallback())(mod)
    prims = [f for _, f in out.functions_items() if isinstance(f, tvm.tirx.PrimFunc)]
    assert prims and all(int(f.attrs["tirx.is_scheduled"]) == 1 for f in prims)
    # each kernel names the rule that took it (kernel profiles report it)
    assert all(str(f.attrs[SCHEDULE_RULE_ATTR]) == "Fallback" for f in prims)
    if first is _Raises:
        assert [e["rule"] for e in log.entries] == ["Exploding"] * len(prims)
        assert "cannot schedule that kernel" in log.entries[0]["error"]
        assert log.entries[0]["kernel"].startswith("fused_matmul")
    else:
        assert log.entries == []


def test_stock_dlight_lets_the_rule_error_escape():
    """Why the guard exists: dlight's own ApplyDefaultSchedule aborts on the first rule error."""
    import tvm
    from tvm.s_tir import dlight as dl

    mod, _ = _matmul_module()
    with tvm.target.Target({"kind": "cuda", "arch": "sm_90"}), pytest.raises(AssertionError):
        dl.ApplyDefaultSchedule(_Raises(), dl.gpu.Fallback())(mod)


def test_scheduled_kernels_are_told_apart_from_those_still_to_schedule():
    """``tirx.is_scheduled`` set and true: left alone by every rule and tuner; set false, a Relax
    function or a plain PrimFunc: not scheduled."""
    from tvm import relax, te

    from inferx_edge.compiler.prim_funcs import is_scheduled, unscheduled

    a = te.placeholder((8,), name="a")
    func = te.create_prim_func([a, te.compute((8,), lambda i: a[i] + 1, name="b")])
    assert unscheduled(func) and not is_scheduled(func)
    assert is_scheduled(func.with_attr("tirx.is_scheduled", True)) and not unscheduled(
        func.with_attr("tirx.is_scheduled", True)
    )
    assert unscheduled(func.with_attr("tirx.is_scheduled", False))
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((8,), "float32"))
    with bb.function("main", [x]):
        bb.emit_func_output(x)
    relax_func = bb.get()["main"]
    assert not unscheduled(relax_func) and not is_scheduled(relax_func)
