"""On a machine with an NVIDIA GPU: the embedded model built for that GPU runs through the runtime with
the outputs of the CPU build (fp32 within float tolerance, int8 to the same top-1). Skipped without a GPU."""

from __future__ import annotations

import numpy as np
import pytest

from inferx_edge import models
from inferx_edge.build import BuildOptions, build_artifact
from inferx_edge.runtime import Engine
from tests.helpers import GPU_TARGETS, local_gpu, needs_gpu


def _cuda_compiler() -> bool:
    from inferx_edge.compiler.cuda.toolkit import discover_nvrtc, find_nvcc

    return bool(discover_nvrtc(None).usable) or find_nvcc(None) is not None


pytestmark = [pytest.mark.gpu, needs_gpu, pytest.mark.skipif(not _cuda_compiler(), reason="no CUDA compiler")]


@pytest.mark.parametrize("precision", ["fp32", "int8"])
def test_gpu_build_matches_the_cpu_build(tmp_path, precision):
    target = GPU_TARGETS.get(local_gpu())
    if target is None:
        pytest.skip(f"no registry target for compute capability {local_gpu()}")
    x, _ = models.holdout()
    x = x[:16]
    outs = {}
    for name in (target, "x86-cpu"):
        art = tmp_path / f"{name}.ixa"
        build_artifact(
            BuildOptions(
                model=models.DEFAULT_MODEL,
                target=name,
                output=art,
                input_shapes={"image": (16, 1, 28, 28)},
                precisions=(precision,),
                tuning=False,
            ),
            log=lambda *a: None,
        )
        with Engine(art) as engine:
            outs[name] = engine.run(x)["logits"]
    gpu, cpu = outs[target], outs["x86-cpu"]
    if precision == "fp32":
        np.testing.assert_allclose(gpu, cpu, rtol=1e-4, atol=1e-4)
    else:
        assert (gpu.argmax(1) == cpu.argmax(1)).mean() >= 0.9
