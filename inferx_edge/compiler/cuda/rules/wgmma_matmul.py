"""dlight rule: int8 dense layers on sm_90a as one wgmma kernel with their fused epilogue
(:mod:`~inferx_edge.compiler.cuda.wgmma_epilogue`), ahead of the mma.sync tensor-core rule, which
keeps every kernel this one refuses (other archs, convolutions, batched or transposed operands,
shapes the kernel does not take, GEMMs of fewer output tiles than the GPU has SMs).
``CudaOptions.wgmma`` (env ``INFERX_WGMMA=0``) switches it off."""

from __future__ import annotations

#: the tile every taken kernel runs with (``wgmma.parse_tile`` spelling; env ``INFERX_WGMMA_TILE``
#: overrides): 128 x 128 x 128-byte stages, three of them (96 KiB, two blocks per SM), every wgmma
#: group waited for at the end of its stage. Fastest of the tiles measured on the zoo's transformer
#: GEMMs, ahead of the mma.sync tile on each (benchmarks/results/wgmma_shapes_s75.json)
TILE = "128:3:k128:sw128"


def wgmma_target(target) -> bool:
    """Whether ``target`` compiles for exactly sm_90a (wgmma is not in sm_90 or any later arch)."""
    return target.kind.name == "cuda" and str(target.attrs.get("arch", "")) == "sm_90a"


def wgmma_kernel(func, target, sm_count: int | None = None):
    """The wgmma kernel the rule below puts in place of ``func`` for ``target`` (a GPU of ``sm_count``
    SMs, None: any GEMM large enough for one tile), or None (off, not sm_90a, not a dense layer it can
    rewrite, too few output tiles to fill the GPU)."""
    from tvm import tirx

    from inferx_edge.compiler.cuda.device_compiler import CudaOptions
    from inferx_edge.compiler.cuda.wgmma_epilogue import wgmma_kernel_for

    options = CudaOptions.from_env()
    if not isinstance(func, tirx.PrimFunc) or not wgmma_target(target) or not options.wgmma:
        return None
    return wgmma_kernel_for(func, min_tiles=sm_count or 0, **rule_tile(options))[0]


def rule_tile(options) -> dict:
    """The tile fields the rule's kernels run with under ``options`` (a ``CudaOptions``): its
    ``wgmma_tile``, else :data:`TILE`."""
    from inferx_edge.compiler.cuda.wgmma import parse_tile

    return parse_tile(options.wgmma_tile or TILE)


def wgmma_takes(func, target, sm_count: int | None = None) -> bool:
    """Whether the rule below takes ``func`` for ``target``: the tile search leaves such kernels alone
    (a tile would be ignored)."""
    return wgmma_kernel(func, target, sm_count) is not None


def wgmma_matmul_rule(sm_count: int | None = None):
    from tvm.s_tir.dlight.base import ScheduleRule

    class WgmmaInt8Matmul(ScheduleRule):
        def apply(self, func, target, _tunable):
            from tvm import s_tir

            kernel = wgmma_kernel(func, target, sm_count)
            return None if kernel is None else s_tir.Schedule(kernel)

        def apply_config(self, func, config):
            return None

    return WgmmaInt8Matmul()
