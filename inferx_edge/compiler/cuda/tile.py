"""The tile of a tensor-core kernel (:class:`TileConfig`): its text form, parse, and the named tiles."""

from __future__ import annotations

from dataclasses import dataclass

#: how many stages ahead of the math each cp.async pipeline's shared-memory loads run
_PIPELINE_LEAD = {"async": 1, "async3": 2, "async4": 3}


#: :attr:`TileConfig.pipeline` values ("": none)
PIPELINES = ("", *_PIPELINE_LEAD)


@dataclass(frozen=True)
class TileConfig:
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
    #: buffers are dynamic shared memory; faster than the synchronous tile on some shapes and slower on
    #: others (``gpu_conv_int8_h200_*async_dyn`` records), so the tile search, not the rule, picks it. With wmma they are static (merged with the int32 tile, TVM 0.27's
    #: LowerAccessPtr rejects some small wmma tiles), and a tile whose static plus dynamic shared memory
    #: passes 48 KB fails to launch. (A register-prefetch pipeline built with TVM's software
    #: pipelining gave wrong sums with wmma: not offered.) "async3": three shared-memory buffers, the
    #: loads of two stages in flight while one is computed; "async4": four buffers, three in flight
    #: (forceable, not a search candidate: it measured slower than async3, benchmarks/README.md).
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
    #: (``.a8.w16``), which win most recorded kernel groups (``tuning_logs/h200/*/tiles.json``).
    acc_pad: int = 0
    #: bytes per weight (B operand) load: 4 by default; 16 where the weight runs along K (int8 conv
    #: weights stored OHWI do); a weight that does not (transposed inside the kernel, [K, J]) keeps 4
    #: (:func:`tensor_core_schedule`; wider ones gathered and failed with "Cannot convert type int32x16").
    weight_vector: int = 4
    #: register buffers per operand fragment (mma only): 2 loads the next 32-deep step's fragments
    #: (ldmatrix) while the current step's mma.sync instructions run (TVM's software pipeline on the
    #: loop inside a shared-memory stage); 1 loads, then multiplies. Stages of one 32-deep step have
    #: nothing to overlap and keep 1. A tile-search candidate only with the 8-warp tiles
    #: (:data:`INT8_WIDE_TILES`, three buffers), where it pays; on 4-warp tiles it measured no faster
    #: than one buffer (``gpu_int8_matmul_h200_tiles*`` records).
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
    def parse(cls, text: str) -> TileConfig:
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
#: as dlight's) with 64-deep reduction stages, through ldmatrix and mma.sync.m16n8k32 (the full-rate
#: int8 instruction) and 16-byte loads of operands the tile does not pad: the fastest of the tiles
#: compared on ResNet-50's conv shapes, faster than dlight's own and than wmma end to end
#: (``gpu_conv_int8_h200*`` records, benchmarks/README.md).
DEFAULT_TILE = TileConfig(warps_i=2, frags_i=4, warps_j=2, frags_j=4, k_frags=4, vector=16, intrin="mma")


#: smaller tiles for small GEMMs (batch 1: ResNet-50's last convolutions have 49 output pixels) and
#: narrow ones (64 output channels), largest first; :func:`tile_for` picks among them. All keep
#: 4 warps and the 64-deep stage of :data:`DEFAULT_TILE`. Smaller GEMMs get a tile that still gives
#: every SM a block (``gpu_conv_int8_h200_b1_pipe`` record).
TILE_LADDER = (
    DEFAULT_TILE,
    TileConfig(warps_i=2, frags_i=2, warps_j=2, frags_j=4, k_frags=4, vector=16, intrin="mma"),  # 64 x 128
    TileConfig(warps_i=2, frags_i=4, warps_j=2, frags_j=2, k_frags=4, vector=16, intrin="mma"),  # 128 x 64
    TileConfig(warps_i=2, frags_i=2, warps_j=2, frags_j=2, k_frags=4, vector=16, intrin="mma"),  # 64 x 64
    TileConfig(warps_i=2, frags_i=1, warps_j=2, frags_j=2, k_frags=4, vector=16, intrin="mma"),  # 32 x 64
    TileConfig(warps_i=2, frags_i=1, warps_j=2, frags_j=1, k_frags=4, vector=16, intrin="mma"),  # 32 x 32
)


#: tiles for GEMMs with fewer than 64 output channels (J): 128 rows by 32 or 16 columns, 4 warps
NARROW_TILES = (
    TileConfig(warps_i=2, frags_i=4, warps_j=2, frags_j=1, k_frags=4, vector=16, intrin="mma"),  # 128 x 32
    TileConfig(warps_i=4, frags_i=2, warps_j=1, frags_j=1, k_frags=4, vector=16, intrin="mma"),  # 128 x 16
)


#: 8-warp tiles the tile search adds for large int8 GEMMs (K >= 1024, at least one block per SM):
#: 128x256 and 256x128 outputs, 64x64 per warp, 128-deep stages, cp.async pipelines only (about
#: 162 KB of shared memory with three buffers: one block per SM). The shape of cuBLASLt's own int8
#: kernel (``cutlass_80_tensorop_i16832gemm_s8_128x256_128x3``). They pay once each stage's copies
#: are spread over its 32-deep steps (:func:`~inferx_edge.compiler.cuda.interleave_pipelined_copies`);
#: with TVM's own loop (two barriers, copies in one burst) the 4-warp tiles stay faster.
INT8_WIDE_TILES = (
    TileConfig(warps_i=2, frags_i=4, warps_j=4, frags_j=4, k_frags=8, vector=16, intrin="mma"),  # 128 x 256
    TileConfig(warps_i=4, frags_i=4, warps_j=2, frags_j=4, k_frags=8, vector=16, intrin="mma"),  # 256 x 128
)
