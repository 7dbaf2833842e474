"""dlight rule: int8 dense layers on sm_90a as one wgmma kernel with their fused epilogue
(:mod:`~inferx_edge.compiler.cuda.wgmma_epilogue`), ahead of the mma.sync tensor-core rule, which
keeps every kernel this one refuses (other archs, convolutions, batched or transposed operands,
shapes the kernel does not take). ``CudaOptions.wgmma`` (env ``INFERX_WGMMA``) switches it."""

from __future__ import annotations

#: the tile every taken kernel runs with (``wgmma.parse_tile`` spelling; env ``INFERX_WGMMA_TILE`` overrides)
TILE = "128:4:i1:k128:sw128"


def wgmma_target(target) -> bool:
    """Whether ``target`` compiles for exactly sm_90a (wgmma is not in sm_90 or any later arch)."""
    return target.kind.name == "cuda" and str(target.attrs.get("arch", "")) == "sm_90a"


def wgmma_kernel(func, target):
    """The wgmma kernel the rule below puts in place of ``func`` for ``target``, or None (off, not
    sm_90a, not a dense layer it can rewrite)."""
    from tvm import tirx

    from inferx_edge.compiler.cuda.device_compiler import CudaOptions
    from inferx_edge.compiler.cuda.wgmma import parse_tile
    from inferx_edge.compiler.cuda.wgmma_epilogue import wgmma_kernel_for

    options = CudaOptions.from_env()
    if not isinstance(func, tirx.PrimFunc) or not wgmma_target(target) or not options.wgmma:
        return None
    return wgmma_kernel_for(func, **parse_tile(options.wgmma_tile or TILE))[0]


def wgmma_takes(func, target) -> bool:
    """Whether the rule below takes ``func`` for ``target``: the tile search leaves such kernels alone
    (a tile would be ignored)."""
    return wgmma_kernel(func, target) is not None


def wgmma_matmul_rule():
    from tvm.s_tir.dlight.base import ScheduleRule

    class WgmmaInt8Matmul(ScheduleRule):
        def apply(self, func, target, _tunable):
            from tvm import s_tir

            kernel = wgmma_kernel(func, target)
            return None if kernel is None else s_tir.Schedule(kernel)

        def apply_config(self, func, config):
            return None

    return WgmmaInt8Matmul()
