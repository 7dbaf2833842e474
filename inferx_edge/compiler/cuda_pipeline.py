"""The Relax pipeline for CUDA targets: TVM's default, with int8 matmuls on tensor cores that compile.

TVM 0.27's default CUDA pipeline schedules untuned kernels with dlight. Its int8 tensor-core rule
(``dlight.gpu.matmul.MatmulInt8Tensorization``) annotates a two-stage software pipeline that the
``InjectSoftwarePipeline`` pass cannot lower for wmma fragments: every int8 matmul with all dims > 64
fails to compile on sm_80/sm_87 (``inject_software_pipeline.cc: fragment_info_``). On ``sm_90a`` the
rule is skipped altogether (dlight reads the arch number with ``isdigit``), so H100/H200 int8 matmuls
ran on CUDA cores.

:class:`Int8SafeMatmul` keeps int8 compute on tensor cores: it applies dlight's int8 tiling (shared-
memory staging, tensorized load/multiply/store) without the software-pipeline annotations, with
ldmatrix + ``mma.sync.m16n8k32`` (the full-rate int8 instruction) in place of wmma's 16x16x16, a tile
chosen per GEMM shape (:func:`int8_config_for`); reads ``sm_90a`` as 90; and leaves every other
matmul to dlight's own rule. The same arch parsing kept fp16 matmuls and convolutions off tensor
cores on ``sm_90a``. From sm_80 they take the same schedule (:func:`tensor_core_schedule`: ldmatrix +
``mma.sync.m16n8k16``, the same tiles, the tile search measures them as it does int8's); below
sm_80, dlight's fp16 wmma schedule without software pipelining. Convolutions reach these rules as
implicit GEMMs (dlight's reindex turns the input window into the A operand in shared memory).

:class:`SmallReduction` schedules reductions over a few elements per output (depthwise convolutions,
pooling windows) one output per thread with the reduction unrolled in registers and the epilogue in
the same thread. dlight's general-reduction rule gave them one thread block per output with 256
threads sharing 9 products (MobileNetV2's depthwise convolutions: 20-28 ms each at batch 64 on an H200).

Kernels with a tuning record keep their tuned schedule (dlight skips scheduled functions).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace

_PIPELINE_KEYS = ("software_pipeline_order", "software_pipeline_stage", "software_pipeline_async_stages")
#: tensor cores when every non-batch matmul dim is at least this (dlight: larger than 64, which left
#: ResNet-50's 64-channel convs on CUDA-core int8: about a quarter of its int8 batch-64 time on an H200)
MIN_TENSORIZE_DIM = 64
#: int8 GEMMs take tensor cores from this many rows (output pixels) when J and K reach
#: :data:`MIN_INT8_DIM`: small row counts get a small tile (:data:`INT8_TILE_LADDER`); batch-1
#: ResNet-50's last convolutions (49 rows) otherwise ran on CUDA cores
MIN_INT8_ROWS = 16
#: int8 GEMMs take tensor cores from this many output channels (J) and reduction elements (K): narrow
#: tiles (16 and 32 columns, :data:`INT8_NARROW_TILES`) and 32-deep stages keep the padding small.
#: MobileNetV2's 16-32-channel pointwise convolutions ran on CUDA cores (64 was the floor).
MIN_INT8_DIM = 16


def sm_version(target) -> int:
    """``sm_90a`` -> 90, ``sm_87`` -> 87; -1 when not a CUDA arch."""
    m = re.match(r"sm_(\d+)", str(target.attrs.get("arch", "")))
    return int(m.group(1)) if m else -1


#: (input, output) dtypes of matmul-like kernels that get a tensor-core schedule: ours
#: (:func:`tensor_core_schedule`, tile per kernel) for all of them from sm_80, dlight's
#: ``MatmulTensorization`` for fp16 on sm_70-sm_75
_INT8 = ("int8", "int32")
_TENSOR_CORE_DTYPES = (_INT8, ("float16", "float16"), ("float16", "float32"))
#: the first architecture our schedule serves fp16 on (fp16 mma.m16n8k16, cp.async)
MIN_FP16_TILE_SM = 80


def _matmul_signature(func) -> tuple[tuple[str, str], list[int]] | None:
    """((input dtype, output dtype), static (I, J, K) extents) of a matmul-like kernel, else None."""
    from tvm import s_tir, tirx
    from tvm.s_tir.dlight.gpu.matmul import get_in_out_dtypes, get_index_map, get_reduction_blocks, get_root_block

    try:
        sch = s_tir.Schedule(func)
        blocks = get_reduction_blocks(sch, sch.get_child_blocks(get_root_block(sch)))
        if not blocks:
            return None
        main = blocks[0]
        dtypes = tuple(str(d) for d in get_in_out_dtypes(sch.get(main)))
        if not get_index_map(sch.get(main)):
            return None
        for i, kind in ((0, "read"), (1, "read"), (0, "write")):
            sch.reindex(main, (kind, i))
        maps = get_index_map(sch.get(main))
        sch.transform_block_layout(main, maps[0])
        extents = []
        for iv in sch.get(main).iter_vars[1:]:
            if not isinstance(iv.dom.extent, tirx.expr.IntImm):
                return None
            extents.append(int(iv.dom.extent.value))
        return dtypes, extents
    except Exception:  # not a matmul dlight can normalize
        return None


#: how many stages ahead of the math each cp.async pipeline's shared-memory loads run
_PIPELINE_LEAD = {"async": 1, "async3": 2, "async4": 3}

#: :attr:`WmmaConfig.pipeline` values ("": none)
PIPELINES = ("", *_PIPELINE_LEAD)


@dataclass(frozen=True)
class WmmaConfig:
    """Tile shape of :func:`tensor_core_schedule`: a thread block computes (16*warps_i*frags_i) x
    (16*warps_j*frags_j) outputs with warps_i*warps_j warps, each warp frags_i x frags_j 16x16
    fragments; the reduction advances 16*k_frags per shared-memory stage; global loads are ``vector``
    bytes per thread. dlight's values are (4, 2, 4, 2, 1, 4)."""

    warps_i: int = 4
    frags_i: int = 2
    warps_j: int = 4
    frags_j: int = 2
    k_frags: int = 1
    vector: int = 4
    #: how global loads overlap the tensor-core math: "" none (load, sync, compute); "async": cp.async
    #: into double-buffered shared memory (sm_80+; needs ``pass_config(async_copy=True)``). With mma the
    #: buffers are dynamic shared memory: exact, 0.96-1.31x the synchronous tile per ResNet-50 conv
    #: shape at batch 64 and 0.84-1.37x at batch 1, 1.38x on a 4096^3 GEMM (H200,
    #: gpu_conv_int8_h200_b64_async_dyn.json, gpu_int8_matmul_h200_untuned.json); not the default
    #: until measured end to end. With wmma they are static (merged with the int32 tile, TVM 0.27's
    #: LowerAccessPtr rejects some small wmma tiles), and a tile whose static plus dynamic shared memory
    #: passes 48 KB fails to launch. (A register-prefetch pipeline built with TVM's software
    #: pipelining gave wrong sums with wmma: not offered.) "async3": three shared-memory buffers, the
    #: loads of two stages in flight while one is computed; "async4": four buffers, three in flight
    #: (not searched: 560-616 TOPS against async3's 670 on the H200's 4096^3 GEMM, _tiles3.json).
    pipeline: str = ""
    #: the warp-level instructions: "wmma" (``wmma::load_matrix_sync``/``mma_sync``, 16x16x16) or "mma"
    #: (``ldmatrix`` into registers and ``mma.sync.m16n8k32``: the full-rate int8 instruction; the
    #: stage depth 16*k_frags must then be a multiple of 32)
    intrin: str = "wmma"
    #: bytes per activation load where the load is predicated (the tile pads rows or depth, or the
    #: convolution pads its input): 4 by default; 8 and 16 compile since
    #: :func:`~inferx_edge.compiler.cuda.fix_int8_vector_constants` repairs TVM's constant int8 vectors
    padded_vector: int = 4
    #: int32 elements added to each row of the shared-memory accumulator tile the epilogue reads.
    #: Unpadded (0), a row is 32-128 ints (a multiple of 32 banks), and the mma store of the
    #: accumulators writes 8 rows per instruction into the same 4 banks (8-way bank conflicts, seen in
    #: the generated CUDA); 8 makes it 2-way. Offered by the tile search with 16-byte weight loads
    #: (``.a8.w16``), which on an H200 were the fastest in 26 of ResNet-50's 30 int8 batch-64 kernel
    #: groups and 15 of MobileNetV2's 21, and took the 4096^3 int8 GEMM from 615 to 677 TOPS.
    acc_pad: int = 0
    #: bytes per weight (B operand) load: 4 by default; 16 where the weight runs along K (int8 conv
    #: weights stored OHWI do); a weight that does not (transposed inside the kernel, [K, J]) keeps 4
    #: (:func:`tensor_core_schedule`; wider ones gathered and failed with "Cannot convert type int32x16").
    weight_vector: int = 4
    #: register buffers per operand fragment (mma only): 2 loads the next 32-deep step's fragments
    #: (ldmatrix) while the current step's mma.sync instructions run (TVM's software pipeline on the
    #: loop inside a shared-memory stage); 1 loads, then multiplies. Stages of one 32-deep step have
    #: nothing to overlap and keep 1. A tile-search candidate only with the 8-warp tiles
    #: (:data:`INT8_WIDE_TILES`, three buffers): there it was the fastest on the H200's 4096^3 int8 GEMM
    #: (758-759 TOPS against 753, gpu_int8_matmul_h200_tiles6.json); on the 4-warp 128x128 tile as fast
    #: as one buffer (685 TOPS, gpu_int8_matmul_h200_tiles5.json).
    fragment_buffers: int = 1

    def text(self) -> str:
        """``WIxFI.WJxFJ.kK.vV[.pP][.aA][.wW][.rR][.async|.async3|.async4].mma|.wmma``, the form :meth:`parse`
        reads (tuning records, benchmark configs)."""
        parts = [
            f"{self.warps_i}x{self.frags_i}",
            f"{self.warps_j}x{self.frags_j}",
            f"k{self.k_frags}",
            f"v{self.vector}",
        ]
        if self.padded_vector != 4:
            parts.append(f"p{self.padded_vector}")
        if self.acc_pad:
            parts.append(f"a{self.acc_pad}")
        if self.weight_vector != 4:
            parts.append(f"w{self.weight_vector}")
        if self.fragment_buffers != 1:
            parts.append(f"r{self.fragment_buffers}")
        if self.pipeline:
            parts.append(self.pipeline)
        return ".".join(parts + [self.intrin])

    @classmethod
    def parse(cls, text: str) -> WmmaConfig:
        """The config :meth:`text` wrote (suffixes in any order; without .mma/.wmma: wmma); ValueError
        naming the expected form otherwise."""
        parts = text.split(".")
        try:
            i, j, k, v, *rest = parts
            wi, fi = (int(x) for x in i.split("x"))
            wj, fj = (int(x) for x in j.split("x"))
            if k[:1] != "k" or v[:1] != "v":
                raise ValueError
            kw = {"pipeline": "", "intrin": "wmma", "padded_vector": 4, "acc_pad": 0, "weight_vector": 4}
            numeric = {"p": "padded_vector", "a": "acc_pad", "w": "weight_vector", "r": "fragment_buffers"}
            seen = set()
            for x in rest:
                if x in PIPELINES[1:]:
                    key = "pipeline"
                elif x in ("mma", "wmma"):
                    key = "intrin"
                elif x[:1] in numeric and x[1:].isdigit():
                    key = numeric[x[0]]
                else:
                    raise ValueError
                if key in seen:
                    raise ValueError
                seen.add(key)
                kw[key] = int(x[1:]) if key in numeric.values() else x
            cfg = cls(wi, fi, wj, fj, int(k[1:]), int(v[1:]), **kw)
        except ValueError:
            raise ValueError(
                f"bad int8 tile '{text}': expected WIxFI.WJxFJ.kK.vV[.pP][.aA][.wW][.rR][.async|.async3|.async4]"
                "[.mma|.wmma], e.g. 2x4.2x4.k4.v16.async.mma"
            ) from None
        if min(cfg.warps_i, cfg.frags_i, cfg.warps_j, cfg.frags_j, cfg.k_frags) < 1:
            raise ValueError(f"bad int8 tile '{text}': warps, fragments and k must be positive")
        if any(v not in (1, 2, 4, 8, 16) for v in (cfg.vector, cfg.padded_vector, cfg.weight_vector)):
            raise ValueError(f"bad int8 tile '{text}': load widths are 1, 2, 4, 8 or 16 bytes")
        if cfg.acc_pad % 4 or not 0 <= cfg.acc_pad < 32:
            raise ValueError(f"bad int8 tile '{text}': the accumulator padding is 0, 4, ..., 28 ints")
        if cfg.fragment_buffers not in (1, 2) or (cfg.fragment_buffers == 2 and cfg.intrin != "mma"):
            raise ValueError(f"bad int8 tile '{text}': fragment buffers are 1, or 2 with mma")
        return cfg


#: the tile int8 tensor-core kernels get: 2x2 warps of 4x4 16x16 fragments (128x128 outputs per block,
#: as dlight's) with 64-deep reduction stages, through ldmatrix and mma.sync.m16n8k32. On an H200
#: (benchmarks/results/gpu_conv_int8_h200.json) this tile was the fastest of five on all six ResNet-50
#: conv shapes at batch 64 with wmma: 1.23-1.61x dlight's (4x2, 4x2, k16) tile, exact. 16-byte loads
#: (operands the tile does not pad) gained 0-6 % over 4-byte ones (gpu_conv_int8_h200_b64_pipe.json).
#: mma against wmma, same tiles (gpu_conv_int8_h200_b64_mma.json, _b1_mma.json): 0.93-1.11x per shape
#: at batch 64, 0.82-1.53x at batch 1; ResNet-50 int8 end to end 3.79 ms (batch 64) and 0.613 ms
#: (batch 1) against 3.90 and 0.718 with wmma (gpu_vision_h200_run13.json against run 10).
INT8_WMMA = WmmaConfig(warps_i=2, frags_i=4, warps_j=2, frags_j=4, k_frags=4, vector=16, intrin="mma")

#: smaller tiles for small GEMMs (batch 1: ResNet-50's last convolutions have 49 output pixels) and
#: narrow ones (64 output channels), largest first; :func:`int8_config_for` picks among them. All keep
#: 4 warps and the 64-deep stage of :data:`INT8_WMMA`. On an H200 at batch 1 the tile this picks ran
#: ResNet-50's layer-2 to layer-4 convolutions 1.3-2.0x faster than the 128x128 tile
#: (gpu_conv_int8_h200_b1_pipe.json).
INT8_TILE_LADDER = (
    INT8_WMMA,
    WmmaConfig(warps_i=2, frags_i=2, warps_j=2, frags_j=4, k_frags=4, vector=16, intrin="mma"),  # 64 x 128
    WmmaConfig(warps_i=2, frags_i=4, warps_j=2, frags_j=2, k_frags=4, vector=16, intrin="mma"),  # 128 x 64
    WmmaConfig(warps_i=2, frags_i=2, warps_j=2, frags_j=2, k_frags=4, vector=16, intrin="mma"),  # 64 x 64
    WmmaConfig(warps_i=2, frags_i=1, warps_j=2, frags_j=2, k_frags=4, vector=16, intrin="mma"),  # 32 x 64
    WmmaConfig(warps_i=2, frags_i=1, warps_j=2, frags_j=1, k_frags=4, vector=16, intrin="mma"),  # 32 x 32
)

#: tiles for GEMMs with fewer than 64 output channels (J): 128 rows by 32 or 16 columns, 4 warps
INT8_NARROW_TILES = (
    WmmaConfig(warps_i=2, frags_i=4, warps_j=2, frags_j=1, k_frags=4, vector=16, intrin="mma"),  # 128 x 32
    WmmaConfig(warps_i=4, frags_i=2, warps_j=1, frags_j=1, k_frags=4, vector=16, intrin="mma"),  # 128 x 16
)

#: 8-warp tiles the tile search adds for large int8 GEMMs (K >= 1024, at least one block per SM):
#: 128x256 and 256x128 outputs, 64x64 per warp, 128-deep stages, cp.async pipelines only (about
#: 162 KB of shared memory with three buffers: one block per SM). The shape of cuBLASLt's own int8
#: kernel on an H200 (``cutlass_80_tensorop_i16832gemm_s8_128x256_128x3``). Once each stage's copies
#: are spread over its 32-deep steps (:func:`~inferx_edge.compiler.cuda.interleave_pipelined_copies`)
#: the 128x256 tile ran the 4096^3 GEMM at 742-754 TOPS against 659-671 for the best 4-warp tile;
#: with TVM's own loop (two barriers, copies in one burst) at 591-605.
INT8_WIDE_TILES = (
    WmmaConfig(warps_i=2, frags_i=4, warps_j=4, frags_j=4, k_frags=8, vector=16, intrin="mma"),  # 128 x 256
    WmmaConfig(warps_i=4, frags_i=4, warps_j=2, frags_j=4, k_frags=8, vector=16, intrin="mma"),  # 256 x 128
)

#: a tile may pad the output channels (J) up to this factor over J rounded up to 64 (to 16 below 64
#: channels): a 128-wide tile doubled the tensor-core work of 64-channel convolutions (ResNet-50's stem
#: and layer 1)
MAX_J_PADDING = 1.125


def _rows(c: WmmaConfig) -> int:
    return 16 * c.warps_i * c.frags_i


def _cols(c: WmmaConfig) -> int:
    return 16 * c.warps_j * c.frags_j


def _blocks(c: WmmaConfig, i: int, j: int) -> int:
    """Thread blocks of tile ``c`` on an I x J output."""
    return -(-i // _rows(c)) * -(-j // _cols(c))


def _pads_j_within_limit(c: WmmaConfig, j: int) -> bool:
    """Whether tile ``c`` pads J by at most :data:`MAX_J_PADDING` over J rounded up to 64 (to 16
    below 64)."""
    return -(-j // _cols(c)) * _cols(c) <= MAX_J_PADDING * (-(-j // 64) * 64 if j >= 64 else -(-j // 16) * 16)


def _fitting_tiles(j: int, ladder) -> list[WmmaConfig]:
    """The tiles of ``ladder`` (with :data:`INT8_NARROW_TILES` ahead of the default ladder below 64
    output channels) that pad J by at most :data:`MAX_J_PADDING`; all of them when none does."""
    if j < 64 and ladder is INT8_TILE_LADDER:
        ladder = INT8_NARROW_TILES + ladder
    return [c for c in ladder if _pads_j_within_limit(c, j)] or list(ladder)


def _stage_depth(cfg: WmmaConfig, k: int) -> WmmaConfig:
    """32-deep reduction stages for K <= 32 (a 64-deep stage would be mostly padding)."""
    return replace(cfg, k_frags=2) if k <= 32 and cfg.intrin == "mma" and cfg.k_frags > 2 else cfg


def int8_config_for(extents, sm_count: int | None, ladder=INT8_TILE_LADDER) -> WmmaConfig:
    """The int8 tile for a GEMM of (I, J, K) ``extents`` (batch dims excluded) on a GPU with
    ``sm_count`` SMs. Among the tiles of ``ladder`` that pad J by at most :data:`MAX_J_PADDING`: the
    largest giving at least one thread block per SM, else the one giving the most blocks; without an
    SM count, the largest."""
    i, j = extents[0], extents[1]
    k = extents[2] if len(extents) > 2 else 1 << 20

    def blocks(c: WmmaConfig) -> int:
        return _blocks(c, i, j)

    fitting = _fitting_tiles(j, ladder)
    if not sm_count:
        return _stage_depth(fitting[0], k)
    for cfg in fitting:
        if blocks(cfg) >= sm_count:
            return _stage_depth(cfg, k)
    return _stage_depth(max(fitting, key=blocks), k)


def _register_int8_mma_intrinsics() -> None:
    """Register the int8 ldmatrix/mma intrinsics for dynamic shared memory that TVM 0.27 defines only
    for fp16 (names as ``get_mma_intrin_group`` gives them); idempotent."""
    from tvm.s_tir import TensorIntrin
    from tvm.s_tir.tensor_intrin import cuda

    for name, make in (
        ("mma_ldmatrix_i8_a_dyn", lambda: cuda.get_ldmatrix_intrin(32, "int8", "A", False, "shared.dyn")),
        ("mma_ldmatrix_i8_b_trans_dyn", lambda: cuda.get_ldmatrix_intrin(32, "int8", "B", True, "shared.dyn")),
        ("mma_store_16x16_i32_shared_dyn_simple_", lambda: cuda.get_mma_store_intrin("int32", 8, "shared.dyn", False)),
    ):
        if TensorIntrin.get(name, allow_missing=True) is None:
            TensorIntrin.register(name, *make())


def _mma_safe_buffer_names(func):
    """``func`` with its parameters renamed to lowercase where needed, or None when that fails: TVM
    0.27's ``mma.sync`` codegen fills the operands into its asm template by replacing the letters A-F
    one after another, so a buffer named like ONNX's ``onnx__Conv_566`` had its "C" replaced by the
    accumulator's address (the generated CUDA did not compile). Parameter names are internal to the
    kernel (Relax calls it positionally); renamed through a TVMScript round trip."""
    import tvm

    names = [p.name for p in func.params if re.search("[A-F]", p.name)]
    if not names:
        return func
    script = func.script()
    taken = set(re.findall(r"\b\w+\b", script))
    for name in names:
        new, n = name.lower(), 0
        while new in taken:
            n += 1
            new = f"{name.lower()}_{n}"
        taken.add(new)
        script = re.sub(rf"\b{re.escape(name)}\b", new, script)
    try:
        renamed = tvm.script.from_source(script)
    except Exception:  # not printable/parsable (e.g. omitted metadata): the caller keeps wmma
        return None
    if isinstance(renamed, tvm.IRModule):
        renamed = renamed[renamed.get_global_vars()[0]]
    return renamed.with_attrs(func.attrs) if func.attrs is not None else renamed


def _innermost_is_reduction(block, read: int) -> bool:
    """Whether the innermost index of ``block``'s ``read``-th operand moves with a reduction axis."""
    from tvm.tirx.analysis import undefined_vars

    reduce = [iv.var for iv in block.iter_vars if iv.iter_type == 2]  # IterVar.CommReduce
    region = block.reads[read].region
    return bool(region) and any(v.same_as(r) for v in undefined_vars(region[-1].min) for r in reduce)


def weights_along_k(func) -> bool:
    """Whether the weight (B) operand of a matmul-like kernel runs along K in memory, as
    :func:`tensor_core_schedule` needs for 16-byte weight loads (False also when ``func`` is not one)."""
    from tvm import s_tir
    from tvm.s_tir.dlight.analysis import get_root_block
    from tvm.s_tir.dlight.gpu.matmul import get_reduction_blocks

    sch = s_tir.Schedule(func)
    blocks = get_reduction_blocks(sch, sch.get_child_blocks(get_root_block(sch)))
    return bool(blocks) and _innermost_is_reduction(sch.get(blocks[0]), 1)


def tensor_core_schedule(func, target, cfg: WmmaConfig | None = None):
    """dlight's int8 wmma matmul schedule (``MatmulInt8Tensorization``) with its tile as parameters,
    without software pipelining (which TVM 0.27 cannot lower for wmma fragments), and with
    ldmatrix/mma.sync in place of wmma when ``cfg.intrin`` is "mma"; for int8 -> int32 and fp16 ->
    fp16/fp32 matmuls (mma.sync.m16n8k32 for int8, m16n8k16 for fp16). Load widths in ``cfg`` are bytes.
    Returns the schedule or None when ``func`` is not a matmul/implicit-GEMM convolution of those
    dtypes it can tensorize."""
    from tvm import s_tir, tirx
    from tvm.s_tir.dlight.analysis import get_root_block
    from tvm.s_tir.dlight.gpu.matmul import (
        auto_inline_consumer_chain,
        auto_inline_producers,
        get_in_out_dtypes,
        get_index_map,
        get_reduction_blocks,
    )
    from tvm.s_tir.tensor_intrin.cuda import get_mma_intrin_group, get_wmma_intrin_group

    if not isinstance(func, tirx.PrimFunc) or "dlight.do_not_tensorize" in func.attrs.keys():
        return None
    cfg = cfg or INT8_WMMA
    if cfg.pipeline not in PIPELINES:
        valid = ", ".join(repr(p) for p in PIPELINES)
        raise ValueError(f"unknown tile load pipeline '{cfg.pipeline}'; valid: {valid} ('': none)")
    if cfg.intrin not in ("wmma", "mma"):
        raise ValueError(f"unknown tensor-core instructions '{cfg.intrin}'; valid: 'wmma', 'mma'")
    mma = cfg.intrin == "mma"
    if mma:
        renamed = _mma_safe_buffer_names(func)
        if renamed is None:
            mma, cfg = False, replace(cfg, intrin="wmma")
        else:
            func = renamed
    sch = s_tir.Schedule(func)
    blocks = sch.get_child_blocks(get_root_block(sch))
    reduction_blocks = get_reduction_blocks(sch, blocks)
    if not reduction_blocks:
        return None
    dtypes = tuple(str(d) for d in get_in_out_dtypes(sch.get(reduction_blocks[0])))
    if dtypes not in _TENSOR_CORE_DTYPES:
        return None
    in_dtype, out_dtype = dtypes
    item = 1 if in_dtype == "int8" else 2  # bytes per operand element
    if mma and in_dtype == "int8" and cfg.k_frags % 2:
        raise ValueError(f"mma int8 tiles reduce 32 elements per instruction: k_frags must be even, got {cfg.k_frags}")
    warp_size, micro = 32, 16
    # int8 mma.m16n8k32 (two per 16x16 output fragment); fp16 mma.m16n8k16; wmma 16x16x16
    micro_k = 32 if mma and in_dtype == "int8" else micro
    i_factors = [None, 1, cfg.warps_i, cfg.frags_i]
    j_factors = [1, None, cfg.warps_j, cfg.frags_j]
    k_factors = [None, cfg.k_frags * micro // micro_k]
    num_ty = cfg.warps_i * cfg.warps_j

    # C[S, I, J] += A[S, I, K] * B[S, J, K] (convolutions: the input window becomes A by reindexing)
    main_block = reduction_blocks[0]
    wide_weights = _innermost_is_reduction(sch.get(main_block), 1)
    reindex_a = sch.reindex(main_block, ("read", 0))
    reindex_b = sch.reindex(main_block, ("read", 1))
    reindex_c = sch.reindex(main_block, ("write", 0))
    index_maps = get_index_map(sch.get(main_block))
    if index_maps is None:
        return None
    matmul_index_map, a_index_map, b_index_map, c_index_map = index_maps
    sch.transform_layout(reindex_a, ("write", 0), a_index_map)
    sch.transform_layout(reindex_b, ("write", 0), b_index_map)
    sch.transform_layout(reindex_c, ("read", 0), c_index_map)
    sch.transform_block_layout(main_block, matmul_index_map)
    tile = [1, micro * cfg.warps_i * cfg.frags_i, micro * cfg.warps_j * cfg.frags_j, micro * cfg.k_frags]
    extents = [iv.dom.extent for iv in sch.get(main_block).iter_vars]

    # ``cfg.vector``-byte loads for A (activations), ``cfg.padded_vector`` where they are predicated:
    # where the tile pads the GEMM (rows I or depth K) or the convolution pads its input. B (weights):
    # ``cfg.weight_vector`` bytes, at most ``cfg.vector``; 4 where B's rows do not run along K (a
    # [K, J] weight: wider vectors would gather, and TVM 0.27's CUDA codegen rejects int32x16 indices)
    def ragged(*axes):
        return any(not isinstance(extents[a], tirx.expr.IntImm) or int(extents[a].value) % tile[a] for a in axes)

    pad_a = ragged(1, 3) or "if_then_else" in func.script()
    weight_vector = cfg.weight_vector if wide_weights else min(4, cfg.weight_vector)
    widths = (min(cfg.vector, cfg.padded_vector) if pad_a else cfg.vector, min(cfg.vector, weight_vector))
    vectors = tuple(max(1, w // item) for w in widths)  # elements per load
    sch.pad_einsum(main_block, tile)

    block = main_block
    batch, i, j, k = sch.get_loops(block)
    i, i_inner = sch.split(i, factors=[None, micro])
    j, j_inner = sch.split(j, factors=[None, micro])
    k, k_inner = sch.split(k, factors=[None, micro_k])
    sch.reorder(i, j, k, i_inner, j_inner, k_inner)
    block_inner = block
    block_outer = sch.blockize(i_inner)
    i0, i1, i2, i3 = sch.split(i, factors=i_factors)
    j0, j1, j2, j3 = sch.split(j, factors=j_factors)
    k0, k1 = sch.split(k, k_factors)
    sch.reorder(i0, j0, i1, j1, j2, i2, k0, k1, i3, j3)
    sch.bind(batch, "blockIdx.z")
    sch.bind(sch.fuse(i0, j0), "blockIdx.x")
    sch.bind(sch.fuse(i1, j1), "blockIdx.y")
    thread_idy = sch.fuse(j2, i2)
    sch.bind(thread_idy, "threadIdx.y")

    # Operands and the accumulator tile share one dynamic allocation (as dlight's), except pipelined
    # wmma operands: merged with the int32 tile, TVM 0.27's LowerAccessPtr rejects some small wmma
    # tiles (int8 vs int32 tvm_access_ptr); they go to static shared memory
    operand_scope = "shared" if cfg.pipeline and not mma else "shared.dyn"

    def fetch_to_shared(block, idx):
        block_read = sch.cache_read(block, idx, operand_scope)
        sch.compute_at(block_read, k0)
        fused = sch.fuse(*sch.get_loops(block_read)[-2:])
        _, f_1, f_2, f_3 = sch.split(fused, factors=[None, num_ty, warp_size, vectors[idx]])
        sch.bind(f_2, "threadIdx.x")
        sch.bind(f_1, "threadIdx.y")
        sch.vectorize(f_3)
        # rows 16 bytes past a multiple of 32 elements: the 8 rows an ldmatrix reads fall in distinct banks
        sch.storage_align(block_read, 0, axis=-2, factor=32, offset=16 // item)
        if not cfg.pipeline:
            sch.annotate(block_read, "tirx.manifest_shared_memory_local_stage", 1)
        sch.annotate(block_read, "double_buffer_scope", 0)
        return block_read

    a_g2s = fetch_to_shared(block_outer, 0)
    b_g2s = fetch_to_shared(block_outer, 1)
    auto_inline_producers(sch, a_g2s)
    auto_inline_producers(sch, b_g2s)
    # registers: wmma fragments, or mma's per-thread "warp" buffers in the ldmatrix/mma.sync layout
    reg_a, reg_b, reg_c = ("warp",) * 3 if mma else ("wmma.matrix_a", "wmma.matrix_b", "wmma.accumulator")
    a_mat = sch.cache_read(block_outer, 0, reg_a)
    b_mat = sch.cache_read(block_outer, 1, reg_b)
    sch.compute_at(a_mat, k1)
    sch.compute_at(b_mat, k1)
    acc_shared = sch.cache_write(block_outer, 0, "shared.dyn")
    sch.storage_align(acc_shared, 0, -2, 16, 4)
    store = sch.cache_write(block_outer, 0, reg_c)
    store_name = sch.get(store).name_hint
    sch.reverse_compute_at(store, thread_idy)
    sch.reverse_compute_at(acc_shared, thread_idy)
    si, sj = sch.get_loops(store)[-2:]
    si0, si1 = sch.split(si, factors=[None, micro])
    sj0, sj1 = sch.split(sj, factors=[None, micro])
    sch.reorder(si0, sj0, si1, sj1)
    init = sch.get_child_blocks(sch.decompose_reduction(block_outer, k0))[0]
    if mma:
        _register_int8_mma_intrinsics()
        # (the accumulator store's warp shuffles are dropped from the CUDA source: see
        # compiler.cuda.drop_own_lane_shuffles)
        intrin = get_mma_intrin_group(operand_scope, "shared.dyn", in_dtype, out_dtype, trans_a=False, trans_b=True)
    else:
        intrin = get_wmma_intrin_group(
            load_scope=operand_scope, store_scope="shared.dyn", in_dtype=in_dtype, out_dtype=out_dtype, trans_b=True
        )
    try:
        loads = []
        for mat in (a_mat, b_mat):  # B is [J, K]: both operand tiles are 16 x micro_k
            li, lj = sch.get_loops(mat)[-2:]
            li0, li1 = sch.split(li, factors=[None, micro])
            lj0, lj1 = sch.split(lj, factors=[None, micro_k])
            sch.reorder(li0, lj0, li1, lj1)
            sch.unroll(li0)
            sch.unroll(lj0)
            loads.append(li1)
        if mma:
            from tvm.s_tir.tensor_intrin.cuda import (
                shared_16x16_to_ldmatrix_32x8_layout,
                shared_16x32_to_ldmatrix_32x16_layout,
            )

            fragment = shared_16x32_to_ldmatrix_32x16_layout if micro_k == 32 else shared_16x16_to_ldmatrix_32x8_layout

            def operand_layout(*idx):
                *lead, r, c = idx
                return (*lead, r // micro, c // micro_k, *fragment(r % micro, c % micro_k))

            def acc_layout(*idx):
                *lead, r, c = idx
                return (*lead, r // micro, c // micro, *shared_16x16_to_ldmatrix_32x8_layout(r % micro, c % micro))

            sch.transform_layout(a_mat, ("write", 0), operand_layout)
            sch.transform_layout(b_mat, ("write", 0), operand_layout)
            sch.transform_layout(store, ("read", 0), acc_layout)
        sch.tensorize(loads[0], intrin["load_a"])
        sch.tensorize(loads[1], intrin["load_b"])
        sch.tensorize(sch.get_loops(init)[-2], intrin["init"])
        sch.tensorize(sch.get_loops(store)[-2], intrin["store"])
        sch.tensorize(sch.get_loops(block_inner)[-3], intrin["compute"])
    except Exception:  # a shape these intrinsics cannot cover
        return None
    # two fragment buffers: k1 (one 32-deep step per iteration: ldmatrix A, ldmatrix B, mma) becomes
    # a prologue (step 0's loads), a loop (the next step's loads, this step's mma) and an epilogue
    # (the last step's mma); TVM expands it before k0, so k0 then has five children
    inner = mma and cfg.fragment_buffers == 2 and k_factors[1] >= 2
    if inner:
        sch.annotate(k1, "software_pipeline_stage", [0, 0, 1])
        sch.annotate(k1, "software_pipeline_order", [0, 1, 2])
    if cfg.pipeline:  # children of k0: A g->s, B g->s, the math (k1, or its three parts); loads run ahead
        lead = _PIPELINE_LEAD[cfg.pipeline]
        math_parts = 3 if inner else 1
        sch.annotate(k0, "software_pipeline_stage", [0, 0] + [lead] * math_parts)
        sch.annotate(k0, "software_pipeline_order", list(range(2 + math_parts)))
        sch.annotate(k0, "software_pipeline_async_stages", [0])
    if cfg.acc_pad:  # on the tensorized store (the block writing the shared tile), rows padded to 32k + pad
        sch.storage_align(sch.get_sblock(store_name + "_o"), 0, axis=-2, factor=32, offset=cfg.acc_pad)
    auto_inline_consumer_chain(sch, acc_shared)
    fused = sch.fuse(*sch.get_loops(acc_shared)[-2:])
    f0, f1, f2 = sch.split(fused, factors=[None, warp_size, 4])
    sch.bind(f1, "threadIdx.x")
    sch.vectorize(f2)
    # each thread's epilogue steps (4 outputs each: a residual load, the requantize, a store) unrolled
    # EPILOGUE_UNROLL at a time, so their global loads are in flight together instead of one step's
    # latency after another
    steps = 2 * cfg.frags_i * cfg.frags_j  # the warp's (16 frags_i) x (16 frags_j) outputs / (32 x 4)
    if steps > 1:
        _, f0 = sch.split(f0, factors=[None, math.gcd(steps, EPILOGUE_UNROLL)])
        sch.unroll(f0)
    return sch


#: epilogue steps per thread issued together (see :func:`tensor_core_schedule`)
EPILOGUE_UNROLL = 8


#: PrimFunc attribute naming the tile a kernel was measured fastest with (``WmmaConfig.text``), set
#: from a tuning database (:func:`inferx_edge.tune.tiles.annotate_tiles`)
TILE_ATTR = "inferx.tile"


def _recorded_tile(func) -> WmmaConfig | None:
    text = func.attrs.get(TILE_ATTR) if func.attrs is not None else None
    return WmmaConfig.parse(str(text)) if text is not None else None


def _tensorizable(dtypes, extents, tiled: bool = True) -> bool:
    """Whether a matmul of these dtypes and (I, J, K) is large enough for tensor cores: from
    :data:`MIN_INT8_ROWS` x :data:`MIN_INT8_DIM` with our schedule's narrow tiles (``tiled``), from
    :data:`MIN_TENSORIZE_DIM` in every dim with dlight's."""
    min_rows, min_dim = (MIN_INT8_ROWS, MIN_INT8_DIM) if tiled else (MIN_TENSORIZE_DIM,) * 2
    return extents[0] >= min_rows and all(e >= min_dim for e in extents[1:])


def tile_gemm_extents(func) -> list[int] | None:
    """(I, J, K) of ``func`` when :func:`int8_safe_matmul_rule` schedules it with
    :func:`tensor_core_schedule` on sm_80+ (an int8 -> int32 or fp16 matmul or implicit-GEMM
    convolution large enough), else None."""
    sig = _matmul_signature(func)
    return sig[1] if sig is not None and sig[0] in _TENSOR_CORE_DTYPES and _tensorizable(*sig) else None


def tile_candidates(
    extents,
    sm_count: int | None,
    input_padded: bool = True,
    ladder=INT8_TILE_LADDER,
    weights_along_k: bool = True,
    int8: bool = True,
) -> list[WmmaConfig]:
    """The tiles a tile search measures for a GEMM of (I, J, K) ``extents``, the default
    (:func:`int8_config_for`) first: the tiles :func:`int8_config_for` chooses among that give at
    least a quarter of a block per SM and are at least a quarter of the default's area (or are the
    default), the two largest of them also with 128-deep reduction stages; each synchronous and with
    the cp.async pipeline (with 128-deep stages and K >= 1024 also the three-buffer one), and where
    its activation loads are predicated (the convolution pads its input, ``input_padded``, or the
    tile does not divide I or K) with 4- and 16-byte loads; each also with the padded accumulator
    tile and 16-byte weight loads (:attr:`WmmaConfig.acc_pad` 8, :attr:`WmmaConfig.weight_vector` 16;
    4-byte ones where the weight does not run along K, ``weights_along_k``: see :func:`weights_along_k`).
    Large ``int8`` GEMMs also get the 8-warp tiles of :data:`INT8_WIDE_TILES` that give every SM a
    block and pad J by at most :data:`MAX_J_PADDING`, with the two- and three-buffer pipelines, the
    same load widths and accumulator/weight pairs, and three buffers with two fragment buffers."""
    i, j, k = extents[0], extents[1], extents[2]
    default = int8_config_for(extents, sm_count, ladder)
    area = _rows(default) * _cols(default)
    tiles = [_stage_depth(c, k) for c in _fitting_tiles(j, ladder)]
    tiles = [c for c in tiles if c == default or 4 * _rows(c) * _cols(c) >= area]
    if sm_count:
        tiles = [c for c in tiles if c == default or 4 * _blocks(c, i, j) >= sm_count]
    if k >= 256:
        tiles += [replace(c, k_frags=2 * c.k_frags) for c in tiles[:2]]
    out = [default]
    for tile in tiles:
        predicated = input_padded or i % _rows(tile) or k % (16 * tile.k_frags)
        # three-buffer pipelines for the 128-deep stages (enough K to keep two stages in flight)
        for pipeline in ("", "async", "async3") if tile.k_frags >= 8 and k >= 1024 else ("", "async"):
            for width in (4, 16) if predicated else (4,):
                for acc_pad, weight_vector in ((0, 4), (8, 16 if weights_along_k else 4)):
                    cfg = replace(
                        tile, pipeline=pipeline, padded_vector=width, acc_pad=acc_pad, weight_vector=weight_vector
                    )
                    if cfg not in out:
                        out.append(cfg)
    if int8 and ladder is INT8_TILE_LADDER and k >= 1024:
        for tile in INT8_WIDE_TILES:
            if (sm_count and _blocks(tile, i, j) < sm_count) or not _pads_j_within_limit(tile, j):
                continue
            predicated = input_padded or i % _rows(tile) or k % (16 * tile.k_frags)
            for width in (4, 16) if predicated else (4,):
                for pipeline, buffers in (("async", 1), ("async3", 1), ("async3", 2)):
                    pairs = (
                        ((0, 4), (8, 16 if weights_along_k else 4))
                        if buffers == 1
                        else ((8, 16 if weights_along_k else 4),)
                    )
                    for acc_pad, weight_vector in pairs:
                        out.append(
                            replace(
                                tile,
                                pipeline=pipeline,
                                padded_vector=width,
                                acc_pad=acc_pad,
                                weight_vector=weight_vector,
                                fragment_buffers=buffers,
                            )
                        )
    return out


def is_int8_gemm(func) -> bool:
    """Whether ``func`` is an int8 -> int32 matmul-like kernel (:func:`tile_candidates`' ``int8``)."""
    sig = _matmul_signature(func)
    return sig is not None and sig[0] == _INT8


def int8_safe_matmul_rule(tile_config: WmmaConfig | None = None, sm_count: int | None = None):
    """A dlight rule: int8 and fp16 tensor-core matmuls with :func:`tensor_core_schedule` (fp16 below
    sm_80: dlight's wmma schedule without software pipelining), else dlight's Matmul.
    ``tile_config``: one tile for every kernel of our schedule; by default each kernel gets the tile recorded in
    its :data:`TILE_ATTR` (a tuning database's), else :func:`int8_config_for` its shape and ``sm_count``."""
    from tvm.s_tir import dlight as dl
    from tvm.s_tir.dlight.gpu import matmul as dl_matmul

    class Int8SafeMatmul(dl.gpu.Matmul):
        def apply(self, func, target, tunable):
            from tvm import tirx

            if not isinstance(func, tirx.PrimFunc) or not self.is_target_available(target):
                return None
            if target.kind.name == "cuda" and sm_version(target) >= 70:
                sig = _matmul_signature(func)
                if sig is not None and sig[0] in _TENSOR_CORE_DTYPES:
                    dtypes, extents = sig
                    ours = dtypes == _INT8 or sm_version(target) >= MIN_FP16_TILE_SM
                    if _tensorizable(dtypes, extents, tiled=ours):
                        if ours:  # built without TVM's software pipelining (cp.async by the tile's choice)
                            cfg = tile_config or _recorded_tile(func) or int8_config_for(extents, sm_count)
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


def _inlined_blocks(rule, func, target):
    """(schedule, block infos after dlight's inlining) of ``func`` for a GPU rule, or None."""
    from tvm import s_tir, tirx
    from tvm.s_tir.dlight import base
    from tvm.s_tir.dlight.analysis import normalize_prim_func

    if not isinstance(func, tirx.PrimFunc) or not rule.is_target_available(target):
        return None
    sch = s_tir.Schedule(func)
    infos = normalize_prim_func(sch)
    return None if infos is None else (sch, base.try_inline(sch, infos))


#: :class:`SmallReduction` takes reductions of at most this many elements per output ...
SMALL_REDUCTION = 64
#: ... with at least this many outputs (enough threads to fill the GPU without a parallel reduction)
MIN_SMALL_REDUCTION_OUTPUTS = 4096
#: fp16 small reductions (depthwise convolutions, pooling) whose innermost output axis (NHWC's channels)
#: is a multiple of this give each thread this many consecutive channels: 16-byte input and weight
#: loads. Measured on an H200, MobileNetV2's 17 fp16 depthwise convolutions at batch 64: 896 -> 439 us
#: in all (1.4-2.4x each, outputs identical; 4 channels per thread: no gain; batch 1: unchanged; an fp32
#: global average pool: slower, so fp32 keeps one output per thread; `benchmarks/gpu_small_reduction.py`)
SMALL_REDUCTION_CHANNELS = 8
_SMALL_REDUCTION_THREADS = 64
#: a thread's copy of an operand window (e.g. 3x3 taps x 8 channels) stays in registers up to this
#: many elements; a larger window is loaded one reduction step at a time
_MAX_THREAD_WINDOW = 128


def _small_reduction_extents(red) -> tuple[int, int] | None:
    """(outputs, reduction elements per output) of a reduction block over static spatial and reduction
    axes, when :class:`SmallReduction` takes it (at most :data:`SMALL_REDUCTION` elements per output,
    at least :data:`MIN_SMALL_REDUCTION_OUTPUTS` outputs); else None."""
    if any(not isinstance(it.dom, int) or it.kind not in "SR" for it in red.iters):
        return None
    s_ext = math.prod(it.dom for it in red.iters if it.kind == "S")
    r_ext = math.prod(it.dom for it in red.iters if it.kind == "R")
    return (s_ext, r_ext) if r_ext <= SMALL_REDUCTION and s_ext >= MIN_SMALL_REDUCTION_OUTPUTS else None


def _loops_below(sch, block, anchor) -> list:
    """The loops of ``block`` nested under the loop ``anchor``."""
    loops = sch.get_loops(block)
    at = sch.get(anchor)
    return loops[[i for i, lp in enumerate(loops) if sch.get(lp).same_as(at)][0] + 1 :]


def _thread_copy(sch, block, tx, reduction_loop) -> None:
    """Place a copy block (a cache read, a padding block) in the thread: its whole window when small,
    else per reduction step; vectorized by 16 bytes along its innermost (contiguous) elements."""
    import tvm

    anchor = tx
    sch.compute_at(block, tx)
    if math.prod(int(sch.get(lp).extent) for lp in _loops_below(sch, block, tx)) > _MAX_THREAD_WINDOW:
        anchor = reduction_loop
        sch.compute_at(block, anchor)
    loops = _loops_below(sch, block, anchor)
    if not loops:  # one element
        return
    lanes = 16 * 8 // tvm.DataType(str(sch.get(block).writes[0].source.dtype)).bits
    window = sch.fuse(*loops) if len(loops) > 1 else loops[0]
    extent = int(sch.get(window).extent)
    if extent % lanes == 0 and extent > lanes:
        steps, vector = sch.split(window, [None, lanes])
        sch.unroll(steps)
        sch.vectorize(vector)
    elif extent == lanes:
        sch.vectorize(window)
    else:
        sch.unroll(window)


def channel_vectorized_reduction(func, target, channels: int = SMALL_REDUCTION_CHANNELS):
    """Schedule a small fp16 reduction with ``channels`` consecutive innermost outputs per thread, or
    None when it does not apply (another dtype, channels not a multiple, a schedule error).

    The input's padding block is not inlined: each thread copies its padded window into registers
    (16-byte loads, the bounds test once per tap), as it does weights and epilogue constants; the
    accumulators and the epilogue stay in the thread, stores are 4 elements wide."""
    from tvm import s_tir
    from tvm.s_tir.dlight.analysis import normalize_prim_func
    from tvm.s_tir.dlight.base import try_inline
    from tvm.s_tir.schedule import ScheduleError

    try:
        sch = s_tir.Schedule(func)
        infos = normalize_prim_func(sch)
        if infos is None:
            return None
        reductions = [i for i, b in enumerate(infos) if "R" in b.dom_kind()]
        if len(reductions) != 1:
            return None
        red = infos[reductions[0]]
        producers = infos[: reductions[0]]  # the input's padding: copied per thread, not inlined
        rest = try_inline(sch, infos[reductions[0] :])
        if (
            rest[0] is not red
            or any(b.is_reduction() for b in rest[1:])
            or any(not p.is_injective() for p in producers)
        ):
            return None
        block = red.block_rv
        kinds = red.dom_kind()
        if {str(r.source.dtype) for r in sch.get(block).reads} != {"float16"} or not re.fullmatch(r"S+R+", kinds):
            return None
        if _small_reduction_extents(red) is None or red.iters[kinds.index("R") - 1].dom % channels:
            return None
        loops = sch.get_loops(block)
        s_loops = [lp for lp, k in zip(loops, kinds) if k == "S"]
        r_loops = [lp for lp, k in zip(loops, kinds) if k == "R"]
        c_out, c_in = sch.split(s_loops[-1], [None, channels])
        sch.reorder(*s_loops[:-1], c_out, *r_loops, c_in)
        bx, tx = sch.split(sch.fuse(*s_loops[:-1], c_out), [None, _SMALL_REDUCTION_THREADS])
        sch.bind(bx, "blockIdx.x")
        sch.bind(tx, "threadIdx.x")
        padded = {sch.get(p.block_rv).writes[0].source.name for p in producers}
        out_name = sch.get(block).writes[0].source.name
        for i, region in enumerate(list(sch.get(block).reads)):
            if region.source.name not in padded and region.source.name != out_name:
                _thread_copy(sch, sch.cache_read(block, i, "local"), tx, r_loops[-1])
        for p in producers:
            sch.set_scope(p.block_rv, 0, "local")
            _thread_copy(sch, p.block_rv, tx, r_loops[-1])
        epilogue = [b.block_rv for b in rest[1:]]
        if not epilogue:  # accumulate in registers, store once
            epilogue = [sch.cache_write(block, 0, "local")]
        else:
            sch.set_scope(block, 0, "local")
        for consumer in reversed(epilogue):
            sch.reverse_compute_at(consumer, tx)
        acc = sch.get(block).writes[0].source.name
        for consumer in epilogue:
            for i, region in enumerate(list(sch.get(consumer).reads)):
                if region.source.scope() == "global" and region.source.name != acc and len(region.region):
                    _thread_copy(sch, sch.cache_read(consumer, i, "local"), tx, tx)
        # 4-wide epilogue: float32x8 constants do not compile in TVM 0.27's CUDA codegen
        store_out, store_in = sch.split(sch.get_loops(epilogue[-1])[-1], [None, 4])
        sch.unroll(store_out)
        sch.vectorize(store_in)
        for lp in (*r_loops, c_in):
            sch.unroll(lp)
        sch.decompose_reduction(block, r_loops[0])
        return sch
    except ScheduleError:
        return None


def small_reduction_rule(channels: int = SMALL_REDUCTION_CHANNELS):
    """A dlight rule for reductions over a few elements per output: :func:`channel_vectorized_reduction`
    for fp16 NHWC ones (``channels`` per thread, a multiple of 4; 1: off), else one output per thread."""
    from tvm.s_tir.dlight.gpu.base import GPUScheduleRule

    class SmallReduction(GPUScheduleRule):
        def apply(self, func, target, _tunable):
            from tvm import tirx

            if not isinstance(func, tirx.PrimFunc) or not self.is_target_available(target):
                return None
            vectorized = channel_vectorized_reduction(func, target, channels) if channels > 1 else None
            if vectorized is not None:
                return vectorized
            found = _inlined_blocks(self, func, target)
            if found is None:
                return None
            sch, infos = found
            reductions = [b for b in infos if "R" in b.dom_kind()]
            if len(reductions) != 1 or any(b.is_reduction() for b in infos if b is not reductions[0]):
                return None
            red = reductions[0]
            if infos.index(red) != 0:  # unfused producers left: not ours
                return None
            if _small_reduction_extents(red) is None:
                return None
            block = red.block_rv
            loops = sch.get_loops(block)
            s_loops = [lp for lp, k in zip(loops, red.dom_kind()) if k == "S"]
            r_loops = [lp for lp, k in zip(loops, red.dom_kind()) if k == "R"]
            sch.reorder(*s_loops, *r_loops)
            bx, tx = sch.split(sch.fuse(*s_loops), factors=[None, 256])
            sch.bind(bx, "blockIdx.x")
            sch.bind(tx, "threadIdx.x")
            for consumer in reversed([b.block_rv for b in infos[1:]]):
                sch.reverse_compute_at(consumer, tx)
            if len(infos) > 1:
                sch.set_scope(block, 0, "local")  # the accumulator never leaves the thread
            else:  # accumulate in a register, store once (not a read-modify-write of global per element)
                sch.reverse_compute_at(sch.cache_write(block, 0, "local"), tx)
            for lp in r_loops:
                sch.unroll(lp)
            sch.decompose_reduction(block, r_loops[0])
            return sch

    return SmallReduction()


def strip_software_pipeline(sch) -> int:
    """Remove software-pipeline annotations from every loop of ``sch``; returns how many."""
    from tvm.s_tir.dlight.gpu.matmul import get_root_block

    def blocks(b):
        out = [b]
        for c in sch.get_child_blocks(b):
            out += blocks(c)
        return out

    removed = 0
    for b in [x for c in sch.get_child_blocks(get_root_block(sch)) for x in blocks(c)]:
        for loop in sch.get_loops(b):  # loops shared by several blocks: re-read, never unannotate twice
            for key in _PIPELINE_KEYS:
                if key in sch.get(loop).annotations:
                    sch.unannotate(loop, key)
                    removed += 1
    return removed


#: :func:`vectorized_elementwise_rule` takes injective kernels with at least this many elements
MIN_VECTORIZED_ELEMENTS = 1 << 16
_VECTOR = 4


def vectorized_elementwise_rule():
    """A dlight rule for large elementwise kernels (int8 quantize, casts, layout changes): each thread
    handles 4 consecutive elements of the innermost axis (16-byte fp32 loads, 4-byte int8 stores).
    dlight's fallback gave one element per thread: ResNet-50's standalone quantize kernels moved
    ~0.7 TB/s on an H200 (4.8 TB/s peak)."""
    from tvm.s_tir.dlight.gpu.base import GPUScheduleRule

    class VectorizedElementwise(GPUScheduleRule):
        def apply(self, func, target, _tunable):
            found = _inlined_blocks(self, func, target)
            if found is None:
                return None
            sch, infos = found
            if len(infos) != 1 or not infos[0].is_injective():
                return None
            extents = [it.dom for it in infos[0].iters]
            if not extents or not all(isinstance(e, int) for e in extents):
                return None
            total = 1
            for e in extents:
                total *= e
            if extents[-1] % _VECTOR or total % (256 * _VECTOR) or total < MIN_VECTORIZED_ELEMENTS:
                return None
            block = infos[0].block_rv
            bx, tx, vec = sch.split(sch.fuse(*sch.get_loops(block)), factors=[None, 256, _VECTOR])
            sch.bind(bx, "blockIdx.x")
            sch.bind(tx, "threadIdx.x")
            sch.vectorize(vec)
            return sch

    return VectorizedElementwise()


def cuda_pipeline(target, tile_config: WmmaConfig | None = None, sm_count: int | None = None):
    """TVM's default CUDA Relax pipeline with :func:`int8_safe_matmul_rule` in place of dlight's Matmul
    and :func:`small_reduction_rule` ahead of its reduction rules, :func:`vectorized_elementwise_rule`
    ahead of its fallback. ``sm_count``: the GPU's SMs, for the int8 tile choice."""
    import tvm
    from tvm import relax
    from tvm.relax.backend.cuda import pipeline as cuda
    from tvm.s_tir import dlight as dl

    from inferx_edge.compiler.tvm_ops import vectorizable_nearbyint

    vectorizable_nearbyint()
    legalize = [
        relax.transform.LegalizeOps(),
        relax.transform.AnnotateTIROpPattern(),
        relax.transform.FoldConstant(),
        relax.transform.FuseOps(),
        relax.transform.FuseTIR(),
        dl.ApplyDefaultSchedule(
            int8_safe_matmul_rule(tile_config, sm_count),
            dl.gpu.GEMV(),
            small_reduction_rule(),
            dl.gpu.Reduction(),
            dl.gpu.GeneralReduction(),
            vectorized_elementwise_rule(),
            dl.gpu.Fallback(),
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
