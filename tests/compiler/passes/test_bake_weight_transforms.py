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
