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


class _SixteenLanes:
    """Schedules an elementwise kernel with 16-lane vectors: for int32 a type CUDA codegen cannot print."""

    name = "SixteenLanes"

    def apply(self, func, target, tunable):
        from tvm import s_tir
        from tvm.s_tir.dlight.analysis import normalize_prim_func

        sch = s_tir.Schedule(func)
        infos = normalize_prim_func(sch)
        if not infos or len(infos) != 1 or "R" in infos[0].dom_kind():
            return None
        bx, tx, vec = sch.split(sch.fuse(*sch.get_loops(infos[0].block_rv)), [None, 64, 16])
        sch.bind(bx, "blockIdx.x")
        sch.bind(tx, "threadIdx.x")
        sch.vectorize(vec)
        return sch


def int32_add_module():
    """One int32 elementwise kernel (x + 1 over 64 x 1024): what :class:`_SixteenLanes` schedules into
    CUDA code TVM cannot generate."""
    import tvm
    from tvm.script import relax as R

    @tvm.script.ir_module
    class Mod:
        @R.function
        def main(x: R.Tensor((64, 1024), "int32")):
            with R.dataflow():
                a = R.add(x, R.const(1, "int32"))
                R.output(a)
            return a

    return Mod


@pytest.mark.skipif(
    not __import__("tests.helpers", fromlist=["nvrtc12_available"]).nvrtc12_available(), reason="needs NVRTC 12"
)
def test_a_schedule_that_fails_code_generation_falls_back_for_that_kernel(monkeypatch, tmp_path):
    """A rule's schedule whose CUDA code cannot be generated (int32x16) does not fail the build: the
    build finds the kernel, compiles again with that rule skipped for it, and records the fallback."""
    import tvm
    from tvm.script import relax as R

    from inferx_edge.compiler import compile as compile_mod
    from inferx_edge.compiler.cuda import pipeline
    from inferx_edge.compiler.variant import PreparedVariant, variant_layout
    from inferx_edge.targets import get_target

    @tvm.script.ir_module
    class Mod:
        @R.function
        def main(x: R.Tensor((64, 1024), "int32"), y: R.Tensor((64, 1024), "float32")):
            with R.dataflow():
                a = R.add(x, R.const(1, "int32"))
                b = R.nn.softmax(y)  # a kernel the bad rule declines
                R.output(a, b)
            return (a, b)

    monkeypatch.setattr(pipeline, "vectorized_elementwise_rule", _SixteenLanes)
    spec = get_target("h200")
    prepared = PreparedVariant(Mod, variant_layout(spec, "fp32"), None, [], None, None, None)
    record = compile_mod.compile_variant(prepared, spec, tmp_path / "lib.so")
    assert (tmp_path / "lib.so").stat().st_size > 0
    (entry,) = record["schedule_fallbacks"]
    assert entry["rule"] == "SixteenLanes" and entry["kernel"].startswith("add")
    assert entry["error"].startswith("code generation:") and "int32x16" in entry["error"]


@pytest.mark.skipif(
    not __import__("tests.helpers", fromlist=["nvrtc12_available"]).nvrtc12_available(), reason="needs NVRTC 12"
)
def test_a_kernel_that_compiles_under_no_rule_is_named_in_the_error(monkeypatch, tmp_path):

    from inferx_edge.compiler import compile as compile_mod
    from inferx_edge.compiler.cuda import pipeline
    from inferx_edge.compiler.variant import PreparedVariant, variant_layout
    from inferx_edge.errors import BuildError
    from inferx_edge.targets import get_target

    Mod = int32_add_module()
    monkeypatch.setattr(pipeline, "vectorized_elementwise_rule", _SixteenLanes)
    monkeypatch.setattr(compile_mod, "MAX_CODEGEN_RETRIES", 0)  # no retry left
    spec = get_target("h200")
    prepared = PreparedVariant(Mod, variant_layout(spec, "fp32"), None, [], None, None, None)
    with pytest.raises(BuildError, match=r"kernel add\w* \(scheduled by SixteenLanes\): .*int32x16"):
        compile_mod.compile_variant(prepared, spec, tmp_path / "lib.so")


def test_code_generation_errors_are_summarised_by_their_diagnostic():
    """NVRTC ends its log with the offending source line and a caret under it: the summary a build log
    shows is the compiler's diagnostic (it showed the caret line), else the last line with words."""
    from inferx_edge.compiler.compile import error_summary

    nvrtc = (
        "RuntimeError: Compilation error:\n"
        "inferx_kernels.cu(203): error: too many arguments in function call\n"
        "    longlong4 v__1 = make_longlong4(4, 4, 4, 4, 4, 4, 4, 4);\n"
        "                                    ^\n"
    )
    assert error_summary(nvrtc) == "inferx_kernels.cu(203): error: too many arguments in function call"
    tvm_check = "Traceback (most recent call last):\n  0: f\nInternalError: Cannot convert type int32x16 to CUDA type\n"
    assert error_summary(tvm_check) == "InternalError: Cannot convert type int32x16 to CUDA type"
    assert error_summary("a failure\n   ^\n") == "a failure" and error_summary("") == ""
