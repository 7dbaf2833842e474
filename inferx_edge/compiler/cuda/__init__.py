"""CUDA targets: the Relax pipeline and its dlight rules, the tensor-core schedule and its tiles, and the
device compiler that turns the generated CUDA into cubins/PTX on the build host.

Layout:

- ``tile.py`` -- :class:`TileConfig`, a tensor-core kernel's tile, its text form and the named tiles;
- ``tile_policy.py`` -- the default tile of a GEMM and the tile search's candidates;
- ``analysis.py`` -- what a kernel is (GEMM extents, dtypes, weights along K, recorded tile);
- ``tensor_core.py`` -- the tensor-core schedule itself; ``lane_indices.py`` -- its operand copies'
  index arithmetic with the vector lane apart;
- ``rules/`` -- one dlight rule per file; ``pipeline.py`` -- the registered Relax pipeline;
- ``toolkit.py`` (NVRTC / nvcc discovery), ``stub.py`` (libcuda stub for GPU-less build hosts),
  ``source_patches.py`` + ``c_scanner.py`` (CUDA source repairs), ``device_compiler.py`` (the compile
  callback, :class:`CudaOptions`).

Why a pipeline of our own: TVM 0.27's default CUDA pipeline schedules untuned kernels with dlight, whose
int8 tensor-core rule annotates a software pipeline that ``InjectSoftwarePipeline`` cannot lower for
wmma fragments (every int8 matmul with all dims > 64 fails to compile on sm_80/sm_87), and which skips
``sm_90a`` altogether (it reads the arch number with ``isdigit``). See ``docs/cuda-codegen.md``.

Old names (one release): ``WmmaConfig`` = :class:`TileConfig`, ``INT8_WMMA`` = :data:`DEFAULT_TILE`,
``INT8_TILE_LADDER`` = :data:`TILE_LADDER`, ``INT8_NARROW_TILES`` = :data:`NARROW_TILES`,
``int8_config_for`` = :func:`tile_for`, ``int8_safe_matmul_rule`` = :func:`tensor_core_matmul_rule`.
"""

from inferx_edge.compiler.cuda.analysis import (
    MIN_FP16_TILE_SM,
    MIN_INT8_DIM,
    MIN_INT8_ROWS,
    MIN_TENSORIZE_DIM,
    TILE_ATTR,
    gemm_batch,
    input_padded,
    is_int8_gemm,
    sm_version,
    tile_gemm_extents,
    weights_along_k,
)
from inferx_edge.compiler.cuda.device_compiler import CUDA_CODE_FORMATS, CUDA_COMPILERS, CudaOptions, device_compiler
from inferx_edge.compiler.cuda.pipeline import cuda_pipeline
from inferx_edge.compiler.cuda.rules.small_reduction import (
    SMALL_REDUCTION,
    SMALL_REDUCTION_CHANNELS,
    channel_vectorized_reduction,
    small_reduction_rule,
)
from inferx_edge.compiler.cuda.rules.tensor_core_matmul import tensor_core_matmul_rule
from inferx_edge.compiler.cuda.rules.vectorized_elementwise import MIN_VECTORIZED_ELEMENTS, vectorized_elementwise_rule
from inferx_edge.compiler.cuda.source_patches import (
    drop_own_lane_shuffles,
    fix_int8_vector_constants,
    interleave_pipelined_copies,
)
from inferx_edge.compiler.cuda.stub import ensure_cuda_codegen
from inferx_edge.compiler.cuda.tensor_core import EPILOGUE_UNROLL, strip_software_pipeline, tensor_core_schedule
from inferx_edge.compiler.cuda.tile import (
    DEFAULT_TILE,
    INT8_WIDE_TILES,
    NARROW_TILES,
    PIPELINES,
    TILE_LADDER,
    TileConfig,
)
from inferx_edge.compiler.cuda.tile_policy import MAX_J_PADDING, tile_candidates, tile_for
from inferx_edge.compiler.cuda.toolkit import Nvcc, Nvrtc, compiler_errors, find_nvcc, find_nvrtc

# old names, kept for one release
WmmaConfig = TileConfig
INT8_WMMA = DEFAULT_TILE
INT8_TILE_LADDER = TILE_LADDER
INT8_NARROW_TILES = NARROW_TILES
int8_config_for = tile_for
int8_safe_matmul_rule = tensor_core_matmul_rule

__all__ = [
    "CUDA_CODE_FORMATS",
    "CUDA_COMPILERS",
    "DEFAULT_TILE",
    "EPILOGUE_UNROLL",
    "INT8_NARROW_TILES",
    "INT8_TILE_LADDER",
    "INT8_WIDE_TILES",
    "INT8_WMMA",
    "MAX_J_PADDING",
    "MIN_FP16_TILE_SM",
    "MIN_INT8_DIM",
    "MIN_INT8_ROWS",
    "MIN_TENSORIZE_DIM",
    "MIN_VECTORIZED_ELEMENTS",
    "NARROW_TILES",
    "PIPELINES",
    "SMALL_REDUCTION",
    "SMALL_REDUCTION_CHANNELS",
    "TILE_ATTR",
    "TILE_LADDER",
    "CudaOptions",
    "Nvcc",
    "Nvrtc",
    "TileConfig",
    "WmmaConfig",
    "channel_vectorized_reduction",
    "compiler_errors",
    "cuda_pipeline",
    "device_compiler",
    "drop_own_lane_shuffles",
    "ensure_cuda_codegen",
    "find_nvcc",
    "find_nvrtc",
    "fix_int8_vector_constants",
    "int8_config_for",
    "int8_safe_matmul_rule",
    "interleave_pipelined_copies",
    "gemm_batch",
    "input_padded",
    "is_int8_gemm",
    "small_reduction_rule",
    "sm_version",
    "strip_software_pipeline",
    "tensor_core_matmul_rule",
    "tensor_core_schedule",
    "tile_candidates",
    "tile_for",
    "tile_gemm_extents",
    "vectorized_elementwise_rule",
    "weights_along_k",
]
