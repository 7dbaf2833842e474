"""An int8 GEMM for sm_90a on warpgroup tensor-core instructions (``wgmma.mma_async``), with the
epilogue of the kernel it replaces applied to the accumulators in registers.

``C[m, n] = epilogue(sum_k A[m, k] * B[n, k])``: A and B are int8 and K-major (a dense layer's
activations and its ``[out, in]`` weight), the sum int32. A block of ``2 x 128`` threads (two
warpgroups) owns a ``128 x bn`` output tile; it walks K in steps of ``bk`` (64 or 128) with a
``stages``-deep ``cp.async`` pipeline into shared memory, where each 16-byte chunk lands in the K-major
layout the wgmma descriptors name (canonical "core matrices" of 8 rows x 16 bytes, or the swizzle whose
rows are one stage's ``bk`` bytes), so the
copies are plain 16-byte ``cp.async`` and no ``ldmatrix`` is issued. Each warpgroup issues ``m64n{128}k32``
instructions for its 64 rows; the accumulator of warp ``w`` holds rows ``16 w .. 16 w + 15`` in the
``mma.sync`` m16n8 layout, repeated over the tile's 8-column groups. Rows past M read clamped
addresses with a zero source size (zero-filled) and are not written.

The kernel is generated per shape, as a scheduled TIR function, like the fused attention kernel. How
the tile's elements leave the kernel is a callable (:data:`Store`) so the fused requantize / bias /
activation / residual tail of a quantized dense layer writes its own outputs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

WARPGROUPS = 2
THREADS = 128 * WARPGROUPS
BM = 64 * WARPGROUPS
#: bytes of K per pipeline stage a tile may take (two or four k32 instructions)
STAGE_BYTES = (64, 128)
#: the swizzles' codes in the matrix descriptor (CUtensorMapSwizzle, as TVM's encoder takes them)
SWIZZLE_CODE = {0: 0, 64: 2, 128: 3}
#: int32 words of padding per staged output row (a warp's fragment writes then hit 16 banks twice,
#: not 4 banks 8 times)
PAD = 4
CORE = 128  # bytes of one core matrix: 8 rows x 16 bytes
#: widest N one wgmma instruction takes here (int8 instructions stop at n224; 128 divides the tiles)
INSTR_N = 128


@dataclass(frozen=True)
class GemmShape:
    """``m x n x k`` of one GEMM and the tile it runs with."""

    m: int
    n: int
    k: int
    bn: int = 128
    stages: int = 4
    #: wgmma groups a warpgroup leaves in flight at the end of a stage (0: waits for all; 1: the next
    #: stage's instructions issue while the last ones run, prefetching one stage less far)
    inflight: int = 0
    #: shared-memory layout of the operand tiles: 0 (canonical, no swizzle) or ``bk`` (the swizzle as
    #: wide as a stage's rows: 64 or 128 bytes)
    swizzle: int = 0
    #: bytes of K per pipeline stage
    bk: int = 64
    #: order the cp.async writes of a stage before wgmma reads them (``fence.proxy.async``, as the PTX
    #: memory model requires). False only to measure what the fence costs (``gpu_wgmma_gemm`` variants
    #: with ``:nf``): a kernel without it may read a stage before its writes are visible.
    proxy_fence: bool = True
    #: the tile's int32 accumulators go through shared memory (rows padded by :data:`PAD` words) and the
    #: epilogue runs with consecutive threads on consecutive columns, so its loads and stores coalesce;
    #: False (``:ds``): each thread applies it to its own fragment (8 rows x 2 columns per warp store)
    stage_out: bool = True

    def __post_init__(self) -> None:
        why = self.unsupported()
        if why:
            raise ValueError(f"wgmma int8 GEMM {self.m}x{self.n}x{self.k}: {why}")

    def unsupported(self) -> str | None:
        if self.m < 1:
            return "empty M"
        if self.bn % INSTR_N:
            return f"tile width {self.bn} is not a multiple of {INSTR_N}"
        if self.n % self.bn:
            return f"N={self.n} is not a multiple of the tile width {self.bn}"
        if self.bk not in STAGE_BYTES:
            return f"stage depth {self.bk}: valid are {', '.join(map(str, STAGE_BYTES))}"
        if self.k % self.bk:
            return f"K={self.k} is not a multiple of the stage depth {self.bk}"
        if self.inflight not in (0, 1) or self.stages < 2 + self.inflight:
            return f"{self.inflight} groups in flight need at least {2 + self.inflight} stages"
        if self.swizzle not in (0, self.bk):
            return f"swizzle {self.swizzle}: valid are 0 and the stage depth {self.bk}"
        return None


def parse_tile(spec: str) -> dict:
    """:class:`GemmShape`'s tile fields from ``BN:STAGES[:i1][:k128][:sw64|:sw128][:nf][:ds]`` (one wgmma
    group in flight, 128-byte stages, the swizzle, no proxy fence, direct fragment stores), e.g.
    ``"256:3:i1:k128:sw128"``; fields a spec leaves out keep :class:`GemmShape`'s defaults."""
    parts = spec.split(":")
    if len(parts) < 2 or not parts[0].isdigit() or not parts[1].isdigit():
        raise ValueError(f"wgmma tile {spec!r}: expected BN:STAGES[:i1][:k64|:k128][:sw64|:sw128][:nf][:ds]")
    flags = {
        "i1": ("inflight", 1), "k64": ("bk", 64), "k128": ("bk", 128), "sw64": ("swizzle", 64),
        "sw128": ("swizzle", 128), "nf": ("proxy_fence", False), "ds": ("stage_out", False),
    }  # fmt: skip
    tile = {"bn": int(parts[0]), "stages": int(parts[1])}
    for flag in parts[2:]:
        if flag not in flags:
            raise ValueError(f"wgmma tile {spec!r}: unknown flag {flag!r} (valid: {', '.join(flags)})")
        field, value = flags[flag]
        tile[field] = value
    return tile


def tile_label(shape: GemmShape) -> str:
    """The :func:`parse_tile` spelling of ``shape``'s tile."""
    flags = ["i1"] * shape.inflight + [f"k{shape.bk}"] + [f"sw{shape.swizzle}"] * bool(shape.swizzle)
    flags += ["nf"] * (not shape.proxy_fence) + ["ds"] * (not shape.stage_out)
    return ":".join([str(shape.bn), str(shape.stages), *flags])


#: ``store(acc, row, col)`` emits (through TVMScript's IR builder) what becomes of the int32
#: accumulator ``acc`` of output element ``(row, col)``; it runs only for ``row < m``.
Store = Callable[..., None]


def split_row(row, extents) -> list:
    """The indices along row axes of ``extents`` (row-major) of flat row ``row``."""
    idx, rest = [], row
    for ext in reversed(extents[1:]):
        idx.append(rest % ext)
        rest = rest // ext
    return [rest, *idx[::-1]]


def element(buf, row, col):
    """The load of element ``(row, col)`` of ``buf`` viewed as a row-major matrix over its last axis."""
    from tvm import tirx

    idx = [*split_row(row, [int(d) for d in buf.shape[:-1]]), col]
    dtype = str(buf.shape[0].ty.dtype) if hasattr(buf.shape[0], "ty") else "int32"
    return buf[tuple(tirx.Cast(dtype, i) if dtype != "int32" else i for i in idx)]


def core_offset(row, chunk, sbo: int, swizzle: int = 0):
    """Byte offset of 16-byte ``chunk`` of tile row ``row`` in the K-major layout. No swizzle: core
    matrices of 8 rows x 16 bytes, adjacent along K ``CORE`` bytes apart (LBO), along M/N ``sbo``
    (checked on an H100). Swizzled: 8-row atoms of ``swizzle``-byte rows, ``sbo`` apart, the chunk
    index XORed with address bits 7-8 (64 bytes: ``(row % 8) // 2``, CUTLASS's ``Swizzle<2, 4, 3>``) or
    7-9 (128 bytes: ``row % 8``, ``Swizzle<3, 4, 3>``)."""
    if swizzle:
        return row // 8 * sbo + row % 8 * swizzle + (chunk ^ (row % 8 // (128 // swizzle))) * 16
    return row // 8 * sbo + chunk * CORE + row % 8 * 16


def operand_start(block64, kk, sbo: int, swizzle: int = 0):
    """Byte offset (in a stage's A or B tile) where the descriptor of one instruction starts: rows
    ``64 block64 ..`` (a warpgroup's A rows, or an instruction's 128 B rows as two 64-row blocks),
    K bytes ``32 kk ..`` (two core matrices per k32 step; 32 bytes into the swizzled rows)."""
    return block64 * 8 * sbo + kk * (32 if swizzle else 2 * CORE)


def descriptor_strides(sbo: int, swizzle: int) -> tuple[int, int, int]:
    """``(LBO, SBO, layout)`` as the matrix descriptor encodes them (bytes / 16; the layout as
    :data:`SWIZZLE_CODE`). A swizzled K-major operand whose K fits one atom has no LBO (1)."""
    return (1 if swizzle else CORE >> 4, sbo >> 4, SWIZZLE_CODE[swizzle])


def acc_row(w, lane, i):
    """Row (within the warpgroup's 64) of accumulator register ``i`` of lane ``lane`` of warp ``w``."""
    return w * 16 + lane // 4 + (i // 2) % 2 * 8


def acc_col(lane, i):
    """Column (within one instruction's N) of accumulator register ``i`` of lane ``lane``."""
    return i // 4 * 8 + lane % 4 * 2 + i % 2


def gemm_body(shape: GemmShape, a, b, store: Store):
    """The kernel's body: ``a`` and ``b`` are buffers whose data hold A as ``[m, k]`` and B as ``[n, k]``,
    row-major (any shape: the kernel reads them through 2-D views); ``store`` writes each element."""
    from tvm.script import tirx as T

    m, n, k, bn, bk, stages = shape.m, shape.n, shape.k, shape.bn, shape.bk, shape.stages
    n_m, n_n, kt = -(-m // BM), n // bn, k // bk
    chunks = bk // 16
    sbo = chunks * CORE  # bytes between 8-row groups of a tile (8 rows of bk bytes)
    stage_a = BM * bk
    stage_bytes = (BM + bn) * bk
    sw = shape.swizzle
    lbo_f, sbo_f, layout = descriptor_strides(sbo, sw)
    ahead = stages - 1 - shape.inflight  # stages prefetched ahead of the one computed
    n_instr = bn // INSTR_N
    regs = INSTR_N // 2  # accumulator registers per instruction and thread
    loads_a = BM * chunks // THREADS
    loads_b = bn * chunks // THREADS
    ld = bn + PAD  # int32 words per staged output row
    staged_bytes = BM * ld * 4 if shape.stage_out else 0

    def mma(acc, base, da, db):
        lanes = [acc[base + i] for i in range(regs)]
        return T.ptx.wgmma.mma_async.sync.aligned.m64n128k32.s32.s8.s8(*lanes, da, db, T.ptx.pred(True))

    @T.macro
    def load_stage(sm, slot, step, tx, bm, bnn):
        for i in T.unroll(loads_a):
            r = T.meta_var((i * THREADS + tx) // chunks)
            c = T.meta_var((i * THREADS + tx) % chunks)
            T.ptx.cp.async_.cg.shared.global_(
                T.address_of(sm[slot * stage_bytes + core_offset(r, c, sbo, sw)]),
                T.address_of(element(a, T.min(bm * BM + r, m - 1), step * bk + c * 16)),
                16,
                T.if_then_else(bm * BM + r < m, T.uint32(16), T.uint32(0)),
            )
        for i in T.unroll(loads_b):
            r = T.meta_var((i * THREADS + tx) // chunks)
            c = T.meta_var((i * THREADS + tx) % chunks)
            T.ptx.cp.async_.cg.shared.global_(
                T.address_of(sm[slot * stage_bytes + stage_a + core_offset(r, c, sbo, sw)]),
                T.address_of(element(b, bnn * bn + r, step * bk + c * 16)),
                16,
                T.uint32(16),
            )

    @T.prim_func(private=True, check_well_formed=False)
    def gemm():
        bx = T.launch_thread("blockIdx.x", n_m * n_n)
        tx = T.launch_thread("threadIdx.x", THREADS)
        sm = T.alloc_buffer((max(stages * stage_bytes, staged_bytes),), "int8", scope="shared.dyn")
        acc = T.alloc_buffer((n_instr * regs,), "uint32", scope="local")
        da = T.alloc_buffer((1,), "uint64", scope="local")
        db = T.alloc_buffer((1,), "uint64", scope="local")
        bm = T.meta_var(bx // n_n)
        bnn = T.meta_var(bx % n_n)
        wg = T.meta_var(tx // 128)
        w = T.meta_var(tx % 128 // 32)
        lane = T.meta_var(tx % 32)
        for i in T.unroll(n_instr * regs):
            acc[i] = T.uint32(0)
        for s in T.unroll(ahead):
            if s < kt:
                load_stage(sm, s, s, tx, bm, bnn)
            T.ptx.cp.async_.commit_group()
        for step in range(kt):
            T.ptx.cp.async_.wait_group(ahead - 1)
            if shape.proxy_fence:
                T.ptx.fence.proxy.async_.shared__cta()
            T.tvm_storage_sync("shared")
            T.ptx.wgmma.fence.sync.aligned()
            for kk in T.unroll(bk // 32):
                T.cuda.wgmma.encode_matrix_descriptor(
                    T.address_of(da[0]),
                    T.address_of(sm[step % stages * stage_bytes + operand_start(wg, kk, sbo, sw)]),
                    lbo_f, sbo_f, layout,
                )  # fmt: skip
                for j in T.unroll(n_instr):
                    T.cuda.wgmma.encode_matrix_descriptor(
                        T.address_of(db[0]),
                        T.address_of(sm[step % stages * stage_bytes + stage_a + operand_start(j * 2, kk, sbo, sw)]),
                        lbo_f, sbo_f, layout,
                    )  # fmt: skip
                    mma(acc, j * regs, da[0], db[0])
            T.ptx.wgmma.commit_group.sync.aligned()
            # the slot of step + ahead was last read by step - 1 - inflight: every warpgroup finished
            # it before this stage's barrier (it waited for all but `inflight` groups)
            if step + ahead < kt:
                load_stage(sm, (step + ahead) % stages, step + ahead, tx, bm, bnn)
            T.ptx.cp.async_.commit_group()
            T.ptx.wgmma.wait_group.sync.aligned(shape.inflight)
        T.ptx.wgmma.wait_group.sync.aligned(0)
        if shape.stage_out:
            staged = T.decl_buffer((BM * ld,), "int32", data=sm.data, scope="shared.dyn")
            T.ptx.cp.async_.wait_group(0)
            T.tvm_storage_sync("shared")  # every warpgroup is done reading the pipeline's stages
            for j in T.unroll(n_instr):
                for i in T.unroll(regs):
                    r = T.meta_var(wg * 64 + acc_row(w, lane, i))
                    staged[r * ld + j * INSTR_N + acc_col(lane, i)] = T.reinterpret("int32", acc[j * regs + i])
            T.tvm_storage_sync("shared")
            for e in range(BM * bn // THREADS):
                r = T.meta_var((e * THREADS + tx) // bn)
                c = T.meta_var((e * THREADS + tx) % bn)
                if bm * BM + r < m:
                    store(staged[r * ld + c], bm * BM + r, bnn * bn + c)
        else:
            for j in T.unroll(n_instr):
                for i in T.unroll(regs):
                    row = T.meta_var(bm * BM + wg * 64 + acc_row(w, lane, i))
                    col = T.meta_var(bnn * bn + j * INSTR_N + acc_col(lane, i))
                    if row < m:
                        store(T.reinterpret("int32", acc[j * regs + i]), row, col)

    return gemm.body


def gemm_kernel(shape: GemmShape):
    """The PrimFunc ``gemm(a[m, k] int8, b[n, k] int8, c[m, n] int32)``: the plain GEMM."""
    import tvm
    from tvm.script.ir_builder import tirx as IB

    a = tvm.tirx.decl_buffer((shape.m, shape.k), "int8", name="a")
    b = tvm.tirx.decl_buffer((shape.n, shape.k), "int8", name="b")
    c = tvm.tirx.decl_buffer((shape.m, shape.n), "int32", name="c")
    body = gemm_body(shape, a, b, lambda acc, row, col: IB.buffer_store(c, acc, [row, col]))
    func = tvm.tirx.PrimFunc([a, b, c], body)
    return func.with_attrs({"tirx.noalias": True, "tirx.is_scheduled": True})
