"""Weight-only transforms run at build time; ones that would grow the weights stay in the model."""

from __future__ import annotations

import numpy as np

from tests.helpers import main_ops


def test_weight_transforms_run_at_build_time_and_give_the_same_results():
    """Bias reshapes and the FC weight transpose leave the model: main takes their results."""
    import tvm
    from tvm import relax

    from inferx_edge.compiler.variant import VariantLayout, prepare_variant
    from inferx_edge.frontend import import_model
    from inferx_edge.models import DEFAULT_MODEL

    im = import_model(DEFAULT_MODEL, {"image": (2, 1, 28, 28)})
    plain = im.mod  # as imported: the transforms run inside main
    nchw = VariantLayout("fp32")
    prepared = prepare_variant(im, nchw, bake=True)
    baked, names, arrays = prepared.mod, prepared.weight_names, prepared.weight_arrays
    assert len(names) == len(arrays) and names != list(im.param_names)

    assert main_ops(plain).count("relax.permute_dims") == 1 and main_ops(plain).count("relax.reshape") == 4
    unbaked = prepare_variant(im, nchw)  # without bake: the same signature, no arrays
    assert (unbaked.weight_names, unbaked.weight_arrays) == (names, None)
    assert "relax.permute_dims" not in main_ops(baked) and main_ops(baked).count("relax.reshape") == 1  # the flatten
    x = np.random.default_rng(0).random((2, 1, 28, 28)).astype(np.float32)

    def run(mod, params):
        vm = relax.VirtualMachine(relax.build(mod, tvm.target.Target({"kind": "llvm"})), tvm.cpu())
        return vm["main"](tvm.runtime.tensor(x), *[tvm.runtime.tensor(p) for p in params]).numpy()

    np.testing.assert_allclose(run(baked, arrays), run(plain, im.params), rtol=1e-6, atol=1e-6)


def test_weight_transforms_that_would_grow_the_weights_stay_in_the_model(monkeypatch):
    from tvm import relax

    from inferx_edge.compiler.passes import bake_weight_transforms

    n = 1 << 19  # a 1-element weight broadcast to 2 MiB
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([1, n], "float32"))
    w = relax.Var("w", relax.TensorType([1], "float32"))
    with bb.function("main", [x, w], attrs={"num_input": 1}):
        with bb.dataflow():
            out = bb.emit_output(relax.op.add(x, relax.op.broadcast_to(w, [1, n])))
        bb.emit_func_output(out)
    mod = bb.get()
    params = [np.ones(1, np.float32)]

    def never(*_a, **_k):  # decided from the static result sizes: a 4 G-float broadcast never runs
        raise AssertionError("the weight transforms were compiled although their results outgrow the weights")

    monkeypatch.setattr(relax, "build", never)
    same, names, arrays = bake_weight_transforms(mod, params)
    assert same is mod and names == ["w"] and arrays is params


def test_a_growing_transform_stays_in_the_model_and_the_rest_is_still_baked():
    """A window mask broadcast to the batch (Swin-T: 39 MB per stage at batch 64) used to send every
    weight transform back into the model; now only the broadcast stays, the weight transpose is baked,
    and the results are the same."""
    import tvm
    from tvm import relax

    from inferx_edge.compiler.passes import bake_weight_transforms

    n, k = 64, 1 << 13  # the mask: 32 KB broadcast to 2 MiB
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([n, k], "float32"))
    w = relax.Var("w", relax.TensorType([k, 16], "float32"))
    mask = relax.Var("mask", relax.TensorType([1, k], "float32"))
    with bb.function("main", [x, w, mask], attrs={"num_input": 1}):
        with bb.dataflow():
            masked = relax.op.add(x, relax.op.broadcast_to(relax.op.multiply(mask, relax.const(2.0)), [n, k]))
            wt = relax.op.permute_dims(relax.op.permute_dims(w))
            out = bb.emit_output(relax.op.matmul(masked, wt))
        bb.emit_func_output(out)
    mod = bb.get()
    rng = np.random.default_rng(0)
    params = [rng.standard_normal((k, 16)).astype(np.float32), rng.standard_normal((1, k)).astype(np.float32)]
    baked, names, arrays = bake_weight_transforms(mod, params)
    assert arrays is not params and "relax.permute_dims" not in main_ops(baked)
    assert "relax.broadcast_to" in main_ops(baked)
    assert sum(a.nbytes for a in arrays) < 2 * sum(p.nbytes for p in params)  # the 2 MiB broadcast is not stored
    xa = rng.standard_normal((n, k)).astype(np.float32)

    def run(m, ps):
        vm = relax.VirtualMachine(relax.build(m, tvm.target.Target({"kind": "llvm"})), tvm.cpu())
        return vm["main"](tvm.runtime.tensor(xa), *[tvm.runtime.tensor(p) for p in ps]).numpy()

    np.testing.assert_allclose(run(baked, arrays), run(mod, params), rtol=1e-5, atol=1e-4)
