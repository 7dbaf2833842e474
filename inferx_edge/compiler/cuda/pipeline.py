"""The Relax pipeline for CUDA targets: TVM's default with our dlight rules first."""

from __future__ import annotations

from inferx_edge.compiler.cuda.rules.column_reduction import column_reduction_rule
from inferx_edge.compiler.cuda.rules.grid_fallback import grid_fallback_rule
from inferx_edge.compiler.cuda.rules.row_reduction import row_reduction_rule
from inferx_edge.compiler.cuda.rules.small_reduction import small_reduction_rule
from inferx_edge.compiler.cuda.rules.tensor_core_matmul import tensor_core_matmul_rule
from inferx_edge.compiler.cuda.rules.tiled_transpose import tiled_transpose_rule
from inferx_edge.compiler.cuda.rules.vectorized_elementwise import vectorized_elementwise_rule
from inferx_edge.compiler.cuda.rules.wgmma_matmul import wgmma_matmul_rule
from inferx_edge.compiler.cuda.rules.window_reduction import window_reduction_rule
from inferx_edge.compiler.cuda.tile import TileConfig


def fusion_passes(sm_count: int | None = None) -> list:
    """Legalization and fusion as every CUDA pipeline does them (before any schedule): the kernels
    these passes make are the ones a build compiles, under the same names (given the same
    ``sm_count``). Long reductions with few outputs for a GPU of ``sm_count`` SMs become two
    (:func:`~inferx_edge.compiler.cuda.split_reductions.split_long_reductions`). A GEMM's result broadcast
    over a larger tensor (squeeze-excite gates) is kept out of the GEMM's kernel
    (:func:`~inferx_edge.compiler.cuda.broadcast_gates.split_broadcast_gates`), and so is a pad
    (:func:`~inferx_edge.compiler.op_patterns.mark_growing_ops_injective`); parameters are renamed
    first so kernel buffers have names the mma.sync codegen can carry
    (:func:`~inferx_edge.compiler.cuda.kernel_names.lowercase_kernel_names`)."""
    from tvm import relax

    from inferx_edge.compiler.cuda.broadcast_gates import split_broadcast_gates
    from inferx_edge.compiler.cuda.concat import legalize_concat
    from inferx_edge.compiler.cuda.kernel_names import lowercase_kernel_names
    from inferx_edge.compiler.cuda.split_reductions import split_long_reductions
    from inferx_edge.compiler.op_patterns import mark_growing_ops_injective

    return [
        lowercase_kernel_names(),
        split_long_reductions(sm_count),
        relax.transform.LegalizeOps({"relax.concat": legalize_concat}),
        relax.transform.AnnotateTIROpPattern(),
        mark_growing_ops_injective(),
        split_broadcast_gates(),
        relax.transform.FoldConstant(),
        relax.transform.FuseOps(),
        relax.transform.FuseTIR(),
    ]


def cuda_pipeline(target, tile_config: TileConfig | None = None, sm_count: int | None = None):
    """TVM's default CUDA Relax pipeline with :func:`tensor_core_matmul_rule` in place of dlight's Matmul,
    :func:`small_reduction_rule` and :func:`window_reduction_rule` ahead of its reduction rules,
    :func:`column_reduction_rule` and :func:`row_reduction_rule` ahead of its ``GeneralReduction``, and
    :func:`tiled_transpose_rule` and :func:`vectorized_elementwise_rule` ahead of its fallback. A rule that raises on a kernel hands it to the next one
    (:mod:`inferx_edge.compiler.guarded_schedule`). ``sm_count``: the GPU's SMs, for the int8 tile choice."""
    import tvm
    from tvm.relax.backend.cuda import pipeline as cuda
    from tvm.s_tir import dlight as dl

    from inferx_edge.compiler.guarded_schedule import guarded_default_schedule
    from inferx_edge.compiler.tensor_intrinsics import import_tensor_intrinsics
    from inferx_edge.compiler.tvm_ops import tvm_op_fixes

    tvm_op_fixes()
    # the tensor-core rules and dlight's import TVM's intrinsics; imported plainly that took 24.6 s
    # alone on a 2-core host (more inside a build process), through this 5.5 s
    import_tensor_intrinsics()
    legalize = [
        *fusion_passes(sm_count),
        guarded_default_schedule(
            wgmma_matmul_rule(sm_count),
            tensor_core_matmul_rule(tile_config, sm_count),
            dl.gpu.GEMV(),
            small_reduction_rule(),
            window_reduction_rule(),
            dl.gpu.Reduction(),
            column_reduction_rule(),
            row_reduction_rule(),
            dl.gpu.GeneralReduction(),
            tiled_transpose_rule(),
            vectorized_elementwise_rule(),
            dl.gpu.Fallback(),
            grid_fallback_rule(),  # only kernels whose Fallback schedule failed code generation
        ),
    ]

    @tvm.transform.module_pass(opt_level=0, name="InferxCUDAPipeline")
    def _pipeline(mod, _ctx):
        with target:
            seq = tvm.transform.Sequential(
                cuda.library_dispatch_passes(target)
                + legalize
                + cuda.dataflow_lower_passes(target)
                + cuda.finalize_passes(target)
            )
            return seq(mod)

    return _pipeline
