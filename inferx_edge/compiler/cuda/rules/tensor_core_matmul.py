"""dlight rule: int8 and fp16 matmuls (and implicit-GEMM convolutions) on tensor cores through
:func:`~inferx_edge.compiler.cuda.tensor_core.tensor_core_schedule`; other matmuls to dlight's own rule."""

from __future__ import annotations

from inferx_edge.compiler.cuda.analysis import (
    _INT8,
    _TENSOR_CORE_DTYPES,
    MIN_FP16_TILE_SM,
    _normalized_gemm,
    _recorded_tile,
    _tensorizable,
    input_padded,
    sm_version,
    weights_along_k,
)
from inferx_edge.compiler.cuda.tensor_core import broadcasting_epilogue, strip_software_pipeline, tensor_core_schedule
from inferx_edge.compiler.cuda.tile import TileConfig
from inferx_edge.compiler.cuda.tile_policy import deep_stages_on, tile_for


def _async_copy() -> bool:
    """Whether the build lowers pipelined shared-memory copies to cp.async (the variant's PassContext)."""
    import tvm

    return bool(tvm.transform.PassContext.current().config.get("tirx.use_async_copy", False))


def tensor_core_matmul_rule(tile_config: TileConfig | None = None, sm_count: int | None = None):
    """A dlight rule: int8 and fp16 tensor-core matmuls with :func:`tensor_core_schedule` (fp16 below
    sm_80: dlight's wmma schedule without software pipelining), else dlight's Matmul.
    ``tile_config``: one tile for every kernel of our schedule; by default each kernel gets the tile recorded in
    its :data:`TILE_ATTR` (a tuning database's), else :func:`tile_for` its shape and ``sm_count``."""
    from tvm.s_tir import dlight as dl
    from tvm.s_tir.dlight.gpu import matmul as dl_matmul

    class Int8SafeMatmul(dl.gpu.Matmul):
        def apply(self, func, target, tunable):
            from tvm import tirx

            if not isinstance(func, tirx.PrimFunc) or not self.is_target_available(target):
                return None
            if broadcasting_epilogue(func):
                return None
            if target.kind.name == "cuda" and sm_version(target) >= 70:
                norm = _normalized_gemm(func)  # once: dtypes, and (batch, I, J, K)
                if norm is not None and norm[0] in _TENSOR_CORE_DTYPES:
                    dtypes, (batch, *extents) = norm
                    ours = dtypes == _INT8 or sm_version(target) >= MIN_FP16_TILE_SM
                    if _tensorizable(dtypes, extents, tiled=ours):
                        if ours:  # built without TVM's software pipelining (cp.async by the tile's choice)
                            cfg = (
                                tile_config
                                or _recorded_tile(func)
                                or tile_for(
                                    extents,
                                    sm_count,
                                    weights_along_k=weights_along_k(func),
                                    int8=dtypes == _INT8,
                                    batch=batch,
                                    input_padded=input_padded(func),
                                    deep_stages=deep_stages_on(target),
                                    async_copy=_async_copy(),
                                )
                            )
                            sch = tensor_core_schedule(func, target, cfg)
                        else:
                            sch = dl_matmul.MatmulTensorization().apply(func, target, tunable)
                            if sch is not None:
                                strip_software_pipeline(sch)
                        if sch is not None:
                            return sch
                    if dtypes == _INT8:
                        # CUDA-core int8 (int8 loads, int32 accumulation), never the crashing tensor-core path
                        func = func.with_attr("dlight.do_not_tensorize", True)
            return super().apply(func, target, tunable)

    return Int8SafeMatmul()
