"""The layout policy per target x precision and the module prepare_variant gives build and tune."""

from __future__ import annotations

import pytest

from tests.helpers import main_ops


def test_float_cpu_convs_run_nhwc_with_hwio_weights():
    """CPU float variants: NHWC/HWIO (vectorized along output channels); int8 CPU and fp32 CUDA stay
    NCHW. The embedded model then has no transpose on its activations: the one-channel input and the
    pooled result are reshaped, and its weights are stored HWIO."""
    from inferx_edge.compiler.variant import prepare_variant, variant_layout
    from inferx_edge.frontend import import_model
    from inferx_edge.models import DEFAULT_MODEL
    from inferx_edge.targets import get_target

    cpu, arm, gpu = get_target("x86-cpu"), get_target("arm64-cpu"), get_target("h200")
    assert [variant_layout(cpu, p).conv for p in ("fp32", "fp16", "int8", "mixed")] == ["NHWC", "NHWC", "NCHW", "NCHW"]
    assert variant_layout(arm, "fp32").conv == "NHWC"
    assert variant_layout(cpu, "fp32").kernel == variant_layout(arm, "fp32").kernel == "HWIO"
    assert (variant_layout(gpu, "fp32").conv, variant_layout(gpu, "int8").conv) == ("NCHW", "NHWC")
    assert (variant_layout(gpu, "fp16").kernel, variant_layout(gpu, "int8").quant_kernel) == ("OHWI", "OHWI")
    assert variant_layout(cpu, "int8").quant_kernel == "OIHW"
    im = import_model(DEFAULT_MODEL, {"image": (2, 1, 28, 28)})
    prepared = prepare_variant(im, variant_layout(cpu, "fp32"), bake=True)
    mod, arrays = prepared.mod, prepared.weight_arrays
    assert "relax.permute_dims" not in main_ops(mod)
    kernels = sorted(a.shape for a in arrays if a.ndim == 4 and a.shape[0] != 1)  # not the (1, 1, 1, C) biases
    assert kernels == [(3, 3, 1, 24), (3, 3, 24, 48), (3, 3, 48, 64)]


def test_tune_tunes_the_kernels_build_compiles_for_each_precision():
    from tvm import relax

    from inferx_edge.frontend import import_model
    from inferx_edge.models import DEFAULT_MODEL
    from inferx_edge.tune.driver import TuneOptions, precision_module

    im = import_model(DEFAULT_MODEL, {"image": (1, 1, 28, 28)})

    from inferx_edge.targets import get_target

    def dtypes(precision, target="x86-cpu"):
        opts = TuneOptions(
            model=DEFAULT_MODEL, target=target, input_shapes={"image": (1, 1, 28, 28)}, precision=precision
        )
        mod = relax.get_pipeline("zero")(precision_module(im, get_target(target), opts, log=lambda *a: None))
        return " ".join(f.script() for gv, f in mod.functions_items() if "conv2d" in gv.name_hint)

    assert '"int8"' in dtypes("int8") and '"int8"' not in dtypes("fp32")
    assert '"float16"' in dtypes("fp16")
    # CUDA variants run convolutions in NHWC: tuning sees the same kernels build compiles
    assert "conv2d_nhwc" in dtypes("int8", "h200") and "conv2d_nhwc" not in dtypes("int8")
    with pytest.raises(Exception, match="unknown precision 'int4'"):
        TuneOptions(model=DEFAULT_MODEL, target="x86-cpu", precision="int4")
