"""The fused attention kernel and the rewrite that uses it.

Here (no GPU): which graphs the rewrite takes and leaves, and that the kernel compiles to tensor-core
code for sm_80 / sm_87 / sm_90. On a GPU (``-m gpu``): the kernel against numpy float64 over ragged
sequence lengths, head widths 16-128, broadcast biases and fully masked rows, and whole attention
blocks built as ``build`` builds them against onnxruntime.
"""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.gpu_attention import CHECKS, check
from tests.helpers import needs_gpu, needs_nvrtc


def _attention_mod(heads=4, width=16, tokens=24, bias_shape=None, scale=0.25, axis=-1, batch=2, tail=None):
    """A Relax module of multi-head attention over ``x[batch, tokens, heads*width]`` (q = k = v = x split
    into heads), scores scaled by a constant, plus an optional bias input; ``tail(bb, out)`` gives what
    the function returns (default the attention's output)."""
    from tvm import relax

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([batch, tokens, heads * width], "float32"))
    params = [x]
    bias = None
    if bias_shape is not None:
        bias = relax.Var("bias", relax.TensorType(list(bias_shape), "float32"))
        params.append(bias)
    with bb.function("main", params):
        with bb.dataflow():
            h = bb.emit(relax.op.permute_dims(relax.op.reshape(x, [batch, tokens, heads, width]), [0, 2, 1, 3]))
            kt = bb.emit(relax.op.permute_dims(h, [0, 1, 3, 2]))
            s = bb.emit(relax.op.multiply(relax.op.matmul(h, kt), relax.const(scale, "float32")))
            if bias is not None:
                s = bb.emit(relax.op.add(s, bias))
            p = bb.emit(relax.op.nn.softmax(s, axis=axis))
            out = relax.op.matmul(p, h)
            out = bb.emit_output(tail(bb, bb.emit(out)) if tail else out)
        bb.emit_func_output(out)
    return bb.get()


def _ops(mod) -> list[str]:
    return [b.value.op.name for blk in mod["main"].body.blocks for b in blk.bindings if hasattr(b.value, "op")]


def _fused(mod):
    from inferx_edge.compiler.passes import fused_attention

    return fused_attention(mod)


def test_scaled_attention_becomes_one_kernel_call_reading_the_projection_output():
    mod = _fused(_attention_mod())
    names = [gv.name_hint for gv in mod.get_global_vars()]
    assert any(n.startswith("fused_attention") for n in names)
    assert "relax.nn.softmax" not in _ops(mod) and "relax.matmul" not in _ops(mod)
    # the head split and both transposes are index maps of the kernel: x itself is its Q, K and V
    assert "relax.permute_dims" not in _ops(mod) and "relax.reshape" in _ops(mod)
    (call,) = [b.value for blk in mod["main"].body.blocks for b in blk.bindings if "call_tir" in str(b.value.op)]
    assert [str(a) for a in call.args[1].fields[:3]] == ["x"] * 3


def test_reshape_coords_pass_kept_axes_through_and_split_merged_ones():
    from inferx_edge.compiler.passes._views import reshape_coords

    a, b = [197, 1, 768], [197, 12, 64]
    rng = np.random.default_rng(0)
    for shape_a, shape_b in ((a, b), (b, a), ([2, 3, 4, 5], [6, 20]), ([6, 20], [2, 3, 4, 5]), ([1, 1], [1])):
        for _ in range(20):
            coords = [int(rng.integers(x)) for x in shape_a]
            flat = np.ravel_multi_index(coords, shape_a)
            assert reshape_coords(coords, shape_a, shape_b) == list(np.unravel_index(flat, shape_b))
    assert reshape_coords(["s", 0, "c"], [197, 1, 64], [197, 64]) == ["s", "c"]  # no arithmetic at all


def test_vector_loads_only_where_every_column_group_is_contiguous_and_aligned():
    from inferx_edge.compiler.passes._views import vector_width

    packed = [197, 4, 3 * 64]  # [tokens, heads, q|k|v x width]
    assert vector_width(lambda n, r, c: (r, n, 64 + c), packed, (4, 197, 64), 8) == 8
    assert vector_width(lambda n, r, c: (r, n, 68 + c), packed, (4, 197, 64), 8) == 1  # 4 elements off 8
    assert vector_width(lambda n, r, c: (r, n, 68 + c), packed, (4, 197, 64), 4) == 4
    assert vector_width(lambda n, r, c: (c, n, r), [64, 4, 197], (4, 197, 64), 8) == 1  # K^T: strided


def test_a_map_described_by_the_same_layout_steps_is_checked_once():
    from inferx_edge.compiler.passes._views import vector_width

    calls = []

    def index(n, r, c):
        calls.append(1)
        return (r, n, c)

    key = ("test", ("reshape", (4, 197, 64), (197, 4, 64)))
    assert vector_width(index, [197, 4, 64], (4, 197, 64), 8, key) == 8
    evaluated = len(calls)
    assert vector_width(index, [197, 4, 64], (4, 197, 64), 8, key) == 8 and len(calls) == evaluated


@pytest.mark.parametrize("bias_shape", [(2, 4, 24, 24), (4, 24, 24), (2, 1, 1, 24), (1, 4, 1, 24)])
def test_a_broadcast_bias_is_taken(bias_shape):
    assert "relax.nn.softmax" not in _ops(_fused(_attention_mod(bias_shape=bias_shape)))


@pytest.mark.parametrize(
    "kwargs",
    [{"width": 20}, {"width": 160}, {"axis": 2}],
    ids=["head-width-not-a-multiple-of-16", "head-wider-than-128", "softmax-over-queries"],
)
def test_attention_the_kernel_cannot_take_is_left_alone(kwargs):
    mod = _fused(_attention_mod(**kwargs))
    assert "relax.nn.softmax" in _ops(mod) and _ops(mod).count("relax.matmul") == 2


def test_the_rewrite_runs_for_reduced_precision_cuda_variants_unless_turned_off(monkeypatch):
    from inferx_edge.compiler.cuda.device_compiler import CudaOptions
    from inferx_edge.compiler.passes import PASSES
    from inferx_edge.compiler.variant import variant_layout
    from inferx_edge.targets import get_target

    (p,) = [p for p in PASSES if p.name == "fused_attention"]

    def runs():
        return {
            (t, prec): p.applies(variant_layout(get_target(t), prec))
            for t in ("h200", "x86-cpu")
            for prec in ("fp32", "fp16", "int8")
        }

    monkeypatch.delenv("INFERX_FUSED_ATTENTION", raising=False)
    assert runs() == {
        ("h200", "fp32"): False, ("h200", "fp16"): True, ("h200", "int8"): True,
        ("x86-cpu", "fp32"): False, ("x86-cpu", "fp16"): False, ("x86-cpu", "int8"): False,
    }  # fmt: skip
    off = variant_layout(get_target("h200"), "int8", CudaOptions(fused_attention=False))
    assert not p.applies(off) and off.attention == "matmul"  # BuildOptions.cuda_options, explicitly
    monkeypatch.setenv("INFERX_FUSED_ATTENTION", "0")
    assert not any(runs().values())


def test_bias_views_pair_axes_of_equal_product():
    from inferx_edge.compiler.passes._views import axis_groups

    assert axis_groups([128, 3], [2, 64, 3]) == [([0], [0, 1]), ([1], [2])]
    assert axis_groups([2, 64, 3], [384]) == [([0, 1, 2], [0])]
    assert axis_groups([6, 4], [4, 6]) == [([0, 1], [0, 1])]


def test_bias_offsets_broadcast_over_the_batch_view():
    from inferx_edge.compiler.cuda.attention import Bias

    b = Bias((1, 4, 3, 1, 7), (5, 4, 3), "float32")  # [.., nW, heads, one row for all queries, T]
    for n, row, col in [(0, 0, 0), (17, 5, 6), (59, 8, 3), (59, 8, 40)]:
        assert b.offset(n, row, col, 9, 7) == ((n // 3) % 4 * 3 + n % 3) * 7 + min(col, 6)
    with pytest.raises(ValueError, match="does not broadcast"):
        Bias((2, 4, 3, 1, 7), (5, 4, 3), "float32")


@needs_nvrtc
@pytest.mark.parametrize("target", ["a100", "jetson-orin", "h200", "h200 int8 heads merged"])
def test_kernel_compiles_to_tensor_core_code(tmp_path, monkeypatch, target):
    import tvm

    from inferx_edge.compiler.compile import resolve_tvm_target
    from inferx_edge.compiler.cuda import device_compiler
    from inferx_edge.compiler.cuda.attention import Bias, Store, attention_kernel
    from inferx_edge.targets import get_target

    monkeypatch.setenv("INFERX_DUMP_CUDA", str(tmp_path))
    spec = get_target(target.split()[0])
    tgt = resolve_tvm_target(spec)
    merged = target.endswith("merged")
    dtype, store = ("int8", Store(3, 40.0)) if merged else ("float16", None)
    f = attention_kernel(24, 49, 49, 32, 32, 0.17, dtype, Bias((1, 3, 49, 49), (8, 3), "float32"), store=store)
    out_shape = [int(x) for x in f.params[-1].shape]
    assert out_shape == ([8, 49, 3, 32] if merged else [24, 49, 32])
    with device_compiler(spec, "cubin") as record, tgt:
        tvm.compile(tvm.IRModule({"attention": f.with_attr("global_symbol", "attention")}), target=tgt)
    assert record["arch"].startswith(spec.cuda_arch)
    source = "".join(p.read_text() for p in tmp_path.iterdir())
    assert "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32" in source
    assert "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16" in source  # V read transposed by ldmatrix


def _mma_per_thread(func) -> int:
    """How many ``mma`` instructions one thread of a live warp issues: every mma call of the kernel's
    TVMScript times the extents of the loops around it (``range`` / ``T.unroll`` headers)."""
    import re

    total, loops = 0, []  # (indent, extent)
    for line in func.script().splitlines():
        indent = len(line) - len(line.lstrip())
        loops = [(i, x) for i, x in loops if i < indent]
        head = re.match(r"\s*for \w+ in (?:T\.unroll|T\.serial|range)\((\d+)\):", line)
        if head:
            loops.append((indent, int(head.group(1))))
        elif "ptx_legacy.mma(" in line:
            total += int(np.prod([x for _, x in loops]))
    return total


@pytest.mark.parametrize("t, want", [(256, 256), (197, 208), (193, 208), (64, 64), (5, 16)])
def test_the_last_key_tile_computes_only_the_16_key_steps_holding_a_key(t, want):
    """Q K^T and P V of 64 query rows (d = dv = 64: 8 mma per 16-key step each way per warp): the key
    tiles of 64 are computed whole, the last one only to the 16-key step holding its last key (197 keys:
    3 x 64 + 16, not 4 x 64)."""
    from inferx_edge.compiler.cuda.attention import attention_kernel

    assert _mma_per_thread(attention_kernel(12, 64, t, 64, 64, 0.125, "float16", None)) == want


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("label,args,kwargs", CHECKS, ids=[c[0] for c in CHECKS])
def test_kernel_matches_float64_attention_on_the_gpu(label, args, kwargs):
    result = check(label, args, kwargs)
    assert result["ok"], result


@pytest.mark.parametrize("label,args,kwargs", CHECKS, ids=[c[0] for c in CHECKS])
def test_the_kernels_te_twin_passes_the_same_checks_on_the_cpu(label, args, kwargs):
    """The index maps and bias offsets both kernels share (and the checks themselves), on this CPU."""
    result = check(label, args, kwargs, cpu=True)
    assert result["ok"], result


def test_the_checks_fail_a_kernel_with_the_wrong_scale(monkeypatch):
    import importlib

    twin = importlib.import_module("inferx_edge.compiler.cuda.attention_reference")
    real = twin.attention_reference
    monkeypatch.setattr(twin, "attention_reference", lambda *a, **kw: real(*a[:5], a[5] * 1.05, *a[6:], **kw))
    label, args, kwargs = CHECKS[0]
    assert not check(label, args, kwargs, cpu=True)["ok"]


@pytest.mark.parametrize("precision", ["int8", "fp16"])
def test_a_cuda_variants_attention_block_emulated_on_the_cpu_matches_onnxruntime(tmp_path, monkeypatch, precision):
    """The attention block prepared as a CUDA variant (fused attention reading the projections'
    outputs through index maps) with the kernel's TE twin, compiled for this CPU."""
    ort = pytest.importorskip("onnxruntime")
    import tvm
    from tvm import relax

    from inferx_edge.compiler.passes.fused_attention import emulated_attention
    from inferx_edge.compiler.variant import prepare_variant, variant_layout
    from inferx_edge.frontend import import_model
    from inferx_edge.targets import get_target
    from tests.compiler.test_zoo_blocks import _model, block_quantizer

    monkeypatch.setenv("INFERX_FUSED_ATTENTION", "1")
    path, shape = _model(tmp_path, "attention")
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    (want,) = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    imported = import_model(path, {})
    quantize = block_quantizer(tmp_path, path, imported, shape) if precision == "int8" else None
    with emulated_attention():
        prepared = prepare_variant(
            imported, variant_layout(get_target("h200"), precision), quantize=quantize, bake=True
        )
    assert any(gv.name_hint.startswith("fused_attention") for gv in prepared.mod.get_global_vars())
    if precision == "int8":  # the kernel writes the out-projection's int8 input, heads merged
        calls = [b.value for blk in prepared.mod["main"].body.blocks for b in blk.bindings]
        written = [str(c.ty.dtype) for c in calls if "fused_attention" in str(getattr(c, "args", [""])[0])]
        assert written == ["int8"], written
    vm = relax.VirtualMachine(tvm.compile(prepared.mod, target="llvm"), tvm.cpu())
    got = vm["main"](tvm.runtime.tensor(x), *[tvm.runtime.tensor(np.asarray(w)) for w in prepared.weight_arrays])
    err = np.linalg.norm(got.numpy() - want) / np.linalg.norm(want)
    assert err < (0.05 if precision == "int8" else 5e-3), err


@needs_nvrtc
def test_an_artifact_built_with_fused_attention_says_so(tmp_path):
    """The whole build (weights baked on the CPU next to a device-only kernel, NVRTC, packaging)."""
    from inferx_edge.build import BuildOptions, build_artifact
    from inferx_edge.compiler.cuda.device_compiler import CudaOptions
    from inferx_edge.package import open_artifact
    from tests.compiler.test_zoo_blocks import _model

    path, _ = _model(tmp_path, "attention")
    out = tmp_path / "a.ixa"
    opts = BuildOptions(
        model=path, target="h200", output=out, precisions=("fp16",), tuning=False,
        cuda_options=CudaOptions(fused_attention=True),
    )  # fmt: skip
    build_artifact(opts, log=lambda *a: None)
    with open_artifact(out) as art:
        assert [v.extra.get("attention") for v in art.manifest.variants] == ["fused"]


def _torch_mha_mod(tokens=20, batch=2, heads=4, width=16, split_scale=False, bias=False):
    """torch's nn.MultiheadAttention as its ONNX export reaches Relax (ViT-B/16's encoder): sequence-first
    packed QKV projection, split by ``take`` after an unsqueeze/transpose/squeeze, heads moved by
    reshapes and transposes, Q scaled by a constant (``split_scale``: Q and K each by its square root,
    given as a reshaped constant, as newer torch exports write it)."""
    from tvm import relax

    e = heads * width
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([tokens, batch, e], "float32"))
    w = relax.const(np.random.default_rng(5).standard_normal((e, 3 * e)).astype(np.float32) * 0.2)
    with bb.function("main", [x]):
        with bb.dataflow():
            qkv = bb.emit(relax.op.matmul(x, w))
            if bias:  # the projection's bias add: the epilogue the fp16 copy of Q/K/V fuses into
                qkv = bb.emit(relax.op.add(qkv, relax.const(np.linspace(-1, 1, 3 * e).astype(np.float32))))
            qkv = bb.emit(relax.op.reshape(qkv, [tokens, batch, 3, e]))
            qkv = bb.emit(relax.op.squeeze(relax.op.permute_dims(relax.op.expand_dims(qkv, [0]), [3, 1, 2, 0, 4]), [3]))
            heads_first = []
            for i in range(3):
                part = bb.emit(relax.op.take(qkv, relax.const(i, "int64"), axis=0))  # [tokens, batch, e]
                part = bb.emit(relax.op.permute_dims(relax.op.reshape(part, [tokens, batch * heads, width]), [1, 0, 2]))
                heads_first.append(bb.emit(relax.op.reshape(part, [batch, heads, tokens, width])))
            if split_scale:
                root = relax.const(np.array([width**-0.25], "float32"))
                root = bb.emit(relax.op.reshape(bb.emit(relax.op.reshape(root, [1, 1, 1, 1])), [1, 1, 1, 1]))
                q = bb.emit(relax.op.multiply(heads_first[0], root))
                k = bb.emit(relax.op.multiply(heads_first[1], root))
            else:
                q = bb.emit(relax.op.multiply(heads_first[0], relax.const(width**-0.5, "float32")))
                k = heads_first[1]
            kt = bb.emit(relax.op.permute_dims(k, [0, 1, 3, 2]))
            p = bb.emit(relax.op.nn.softmax(relax.op.matmul(q, kt), axis=-1))
            out = bb.emit_output(relax.op.matmul(p, heads_first[2]))
        bb.emit_func_output(out)
    return bb.get()


def _assert_same_on_the_cpu(fused, mod):
    """The rewritten module (the kernel's TE twin) and the original, on one seeded [20, 2, 64] input."""
    import tvm
    from tvm import relax

    x = np.random.default_rng(0).standard_normal((20, 2, 64)).astype(np.float32)
    got, want = (
        relax.VirtualMachine(tvm.compile(m, target="llvm"), tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
        for m in (fused, mod)
    )
    assert np.abs(got - want).max() <= 3e-3 * np.abs(want).max()


@pytest.mark.parametrize("split_scale", [False, True], ids=["scaled_q", "scaled_q_and_k"])
def test_torch_mha_reads_q_k_v_from_the_packed_projection_and_matches_two_matmuls(split_scale):

    from inferx_edge.compiler.passes.fused_attention import emulated_attention, fused_attention

    mod = _torch_mha_mod(split_scale=split_scale)
    with emulated_attention():
        fused = fused_attention(mod)
    ops = _ops(fused)
    assert "relax.nn.softmax" not in ops and "relax.take" not in ops and "relax.permute_dims" not in ops
    assert "relax.multiply" not in ops  # the scales are the kernel's, whatever operand they were on
    _assert_same_on_the_cpu(fused, mod)


def test_the_fused_kernel_is_not_a_tuning_task(tmp_path):
    """MetaSchedule extracts every PrimFunc; the hand-scheduled attention kernel has nothing to search
    (and its thread bindings are not a space to sample), so ``tune`` leaves it out."""
    from tvm.s_tir import meta_schedule as ms

    from inferx_edge.compiler.compile import resolve_tvm_target
    from inferx_edge.compiler.variant import prepare_variant, variant_layout
    from inferx_edge.frontend import import_model
    from inferx_edge.targets import get_target
    from inferx_edge.tune.driver import tunable_tasks
    from tests.compiler.test_zoo_blocks import _model

    path, _ = _model(tmp_path, "attention")
    spec = get_target("h200")
    mod = prepare_variant(import_model(path, {}), variant_layout(spec, "fp16")).mod
    target = resolve_tvm_target(spec)
    every = [t.task_name for t in ms.relax_integration.extract_tasks(mod, target)]
    tunable = [t.task_name for t in tunable_tasks(mod, target)]
    assert "fused_attention" in every and "fused_attention" not in tunable
    assert tunable == [n for n in every if n != "fused_attention"] and tunable


def test_a_projection_epilogue_writes_q_k_v_as_fp16_once():
    """A float32 Q/K/V source made by an elementwise op (the projection's bias add) is cast to fp16
    there, once for all three operands; a source straight from a matmul keeps its float32 read."""

    from inferx_edge.compiler.passes.fused_attention import emulated_attention, fused_attention

    def operand_dtypes(m):
        (call,) = [b.value for blk in m["main"].body.blocks for b in blk.bindings if "call_tir" in str(b.value.op)]
        return [str(a.ty.dtype) for a in call.args[1].fields[:3]]

    with emulated_attention():
        plain, biased = fused_attention(_torch_mha_mod()), fused_attention(_torch_mha_mod(bias=True))
    assert operand_dtypes(plain) == ["float32"] * 3
    assert operand_dtypes(biased) == ["float16"] * 3
    assert _ops(biased).count("relax.astype") == 1  # one copy, shared by Q, K and V
    _assert_same_on_the_cpu(biased, _torch_mha_mod(bias=True))


def test_the_fused_kernel_does_not_count_as_a_tuned_kernel(tmp_path):
    """A build with a tuning database reports how many kernels got a database schedule; the
    hand-scheduled attention kernel is not one of them (nor does it make the variant 'tuned')."""
    from inferx_edge.compiler.compile import resolve_tvm_target
    from inferx_edge.compiler.tuning import apply_tuning
    from inferx_edge.compiler.variant import prepare_variant, variant_layout
    from inferx_edge.frontend import import_model
    from inferx_edge.targets import get_target
    from tests.compiler.test_zoo_blocks import _model

    path, _ = _model(tmp_path, "attention")
    spec = get_target("h200")
    mod = prepare_variant(import_model(path, {}), variant_layout(spec, "fp16")).mod
    assert any(gv.name_hint.startswith("fused_attention") for gv in mod.get_global_vars())
    empty = tmp_path / "db"
    empty.mkdir()
    _, tuned, tiled, total = apply_tuning(mod, resolve_tvm_target(spec), empty)
    assert (tuned, tiled) == (0, 0) and total >= 2


def _quantized_attention_mod(float_reader: bool):
    """:func:`_attention_mod`'s output with its heads merged and quantized to int8 (as the int8 rewrite
    writes it); with ``float_reader`` the merged float32 output is returned too."""
    from tvm import relax

    def tail(bb, att):
        merged = bb.emit(relax.op.reshape(relax.op.permute_dims(att, [0, 2, 1, 3]), [2, 24, 64]))
        scaled = bb.emit(relax.op.multiply(merged, relax.const(np.float32(40.0))))
        q = bb.emit(relax.op.astype(relax.op.clip(relax.op.round(scaled), -127, 127), "int8"))
        return relax.Tuple([q, merged]) if float_reader else q

    return relax.transform.Normalize()(_attention_mod(tail=tail))


@pytest.mark.parametrize("float_reader", [False, True], ids=["quantized_only", "also_read_as_float"])
def test_an_output_only_merged_and_quantized_is_written_so_by_the_kernel(float_reader):
    """Heads merged ([2, 4, 24, 16] -> [2, 24, 64]) and quantized to int8 and read by nothing else: the
    kernel writes the int8 [2, 24, 4, 16] tensor itself, no transpose or quantize left. Also read as
    float: the kernel writes float32 and the rest stays."""
    import tvm
    from tvm import relax

    from inferx_edge.compiler.passes.fused_attention import emulated_attention, fused_attention

    mod = _quantized_attention_mod(float_reader)
    with emulated_attention():
        fused = fused_attention(mod)
    bound = [b.value for blk in fused["main"].body.blocks for b in blk.bindings]
    (call,) = [v for v in bound if "call_tir" in str(getattr(v, "op", ""))]
    assert str(call.ty.dtype) == ("float32" if float_reader else "int8")
    if not float_reader:
        assert [int(x) for x in call.ty.shape] == [2, 24, 4, 16]
        assert not {"relax.permute_dims", "relax.round", "relax.astype"} & set(_ops(fused))
    x = np.random.default_rng(0).standard_normal((2, 24, 64)).astype(np.float32)
    got, want = (
        relax.VirtualMachine(tvm.compile(m, target="llvm"), tvm.cpu())["main"](tvm.runtime.tensor(x))
        for m in (fused, mod)
    )
    got, want = (o[0] if float_reader else o for o in (got, want))
    # int8 codes: the fp16 output moves a code by at most one step where it sat on a rounding boundary
    assert np.abs(got.numpy().astype(int) - want.numpy().astype(int)).max() <= 1


@pytest.mark.parametrize(
    "ops, want",
    [
        ([("reshape", [2, 4, 24, 16]), ("permute", [0, 2, 1, 3]), ("reshape", [2, 24, 64])], 4),
        ([("reshape", [2, 4, 24, 16]), ("permute", [0, 2, 1, 3])], 4),
        ([("reshape", [8 * 24 * 16])], 1),
        ([], 1),
        ([("reshape", [2, 4, 24, 16]), ("permute", [1, 2, 0, 3])], None),  # heads outermost
        ([("permute", [0, 2, 1])], None),  # rows and columns swapped
    ],
)
def test_the_output_layouts_the_kernel_writes_itself(ops, want):
    """An [8, 24, 16] attention output (2 images x 4 heads) through layout ops: the heads merged side by
    side is a layout the kernel writes (heads = 4; as computed: 1), others are not."""
    from inferx_edge.compiler.passes.attention_outputs import _heads

    assert _heads(ops, [8, 24, 16]) == want


def test_common_refinement_of_batch_views():
    from inferx_edge.compiler.passes._views import common_refinement

    assert common_refinement([[4096, 3], [64, 64, 3]]) == [64, 64, 3]
    assert common_refinement([[12], [1, 12]]) == [12]
    assert common_refinement([[6, 4], [4, 6]]) is None


def test_a_window_mask_in_a_finer_batch_view_is_not_expanded_over_the_batch():
    """Swin's shifted windows: scores [batch x windows, heads, S, S] viewed as [batch, windows, heads,
    S, S] for the window mask [1, windows, 1, S, S], plus a relative position bias [heads, S, S]. The
    kernel's bias covers [windows, heads, S, S] (not batch x windows x heads) and the result matches the
    two matmuls."""
    import tvm
    from tvm import relax

    from inferx_edge.compiler.passes.fused_attention import emulated_attention, fused_attention

    batch, windows, heads, s, width = 3, 4, 2, 9, 16
    rng = np.random.default_rng(0)
    mask = relax.const(np.where(rng.random((1, windows, 1, s, s)) < 0.3, -100.0, 0.0).astype(np.float32))
    rel = relax.const(rng.standard_normal((heads, s, s)).astype(np.float32))
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([batch * windows, s, heads * width], "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            h = bb.emit(relax.op.permute_dims(relax.op.reshape(x, [batch * windows, s, heads, width]), [0, 2, 1, 3]))
            kt = bb.emit(relax.op.permute_dims(h, [0, 1, 3, 2]))
            sc = bb.emit(relax.op.add(relax.op.multiply(relax.op.matmul(h, kt), relax.const(0.25, "float32")), rel))
            sc = bb.emit(relax.op.reshape(sc, [batch, windows, heads, s, s]))
            sc = bb.emit(relax.op.reshape(relax.op.add(sc, mask), [batch * windows, heads, s, s]))
            out = bb.emit_output(relax.op.matmul(relax.op.nn.softmax(sc, axis=-1), h))
        bb.emit_func_output(out)
    mod = relax.transform.Normalize()(bb.get())
    with emulated_attention():
        fused = fused_attention(mod)
    bound = [b.value for blk in fused["main"].body.blocks for b in blk.bindings]
    (call,) = [v for v in bound if "call_tir" in str(getattr(v, "op", ""))]
    bias_elems = int(call.args[1].fields[3].ty.shape[0])
    assert bias_elems == windows * heads * s * s
    xv = rng.standard_normal((batch * windows, s, heads * width)).astype(np.float32)
    got, want = (
        relax.VirtualMachine(tvm.compile(m, target="llvm"), tvm.cpu())["main"](tvm.runtime.tensor(xv)).numpy()
        for m in (fused, mod)
    )
    assert np.abs(got - want).max() <= 3e-3 * np.abs(want).max()
