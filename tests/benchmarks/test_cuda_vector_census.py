"""The vector census reads kernels out of CUDA source and finds the loops the vectorizer scalarized."""

from __future__ import annotations

import pytest

SOURCE = """
extern "C" __global__ void __launch_bounds__(256) fused_concatenate_cast_kernel(half* __restrict__ x0_ptr);
extern "C" __global__ void __launch_bounds__(256) fused_concatenate_cast_kernel(half* __restrict__ x0_ptr) {
  half4 condval = *(half4*)(x0_ptr + ((int)threadIdx.x) * 4);
}

extern "C" __global__ void __launch_bounds__(128) fused_conv2d_kernel(signed char* __restrict__ a_ptr) {
  for (int ax0_ax1_fused_3_s = 0; ax0_ax1_fused_3_s < 16; ++ax0_ax1_fused_3_s) {
    a_ptr[ax0_ax1_fused_3_s] = (signed char)0;
  }
}

extern "C" __global__ void fused_concatenate1_kernel(half* __restrict__ y_ptr) {
  for (int ax3_1_s = 0; ax3_1_s < 4; ++ax3_1_s) {
    y_ptr[ax3_1_s] = y_ptr[ax3_1_s + 8];
  }
  for (int k = 0; k < 4; ++k) { }
}
"""


def test_census_names_scalarized_kernels():
    from benchmarks.cuda_vector_census import census, kernels

    assert sorted(kernels(SOURCE)) == [
        "fused_concatenate1_kernel",
        "fused_concatenate_cast_kernel",
        "fused_conv2d_kernel",
    ]
    got = census([SOURCE])
    assert got == {
        "kernels": 3,
        "scalarized": 2,
        "concat_kernels": 2,
        "concat_scalarized": 1,
        "scalarized_kernels": ["fused_concatenate1_kernel", "fused_conv2d_kernel"],
    }


def test_missing_model_is_named(tmp_path, capsys):
    from benchmarks.cuda_vector_census import main

    with pytest.raises(SystemExit) as exc:
        main(["--models", "no_such_net", "--zoo-dir", str(tmp_path), "--name", "unused"])
    assert exc.value.code == 2
    assert "no_such_net" in capsys.readouterr().err
