"""Repairs and rewrites of the CUDA source TVM 0.27 generates, applied before it is compiled.

Each patch says what TVM emits, why it is wrong or slow, and when it can go (its removal condition);
``tests/compiler/cuda/test_source_patches.py`` holds a guard test per patch that fails once TVM stops
emitting the pattern, so the patch is removed then rather than left as dead code.

- :func:`fix_int8_vector_constants` -- remove when TVM prints constant 8/16-lane int8 vectors that compile.
- :func:`fix_gathered_half8_packs` -- remove when TVM packs a gathered 8-lane fp16 vector in compilable code.
- :func:`drop_own_lane_shuffles` -- remove when TVM reads a thread's own warp-buffer values without a shuffle.
- :func:`interleave_pipelined_copies` -- remove when TVM's software pipeline can spread a stage's
  cp.async copies over the inner loop with one barrier per stage."""

from __future__ import annotations

import re

from inferx_edge.compiler.cuda.c_scanner import _close, _statements

_CHAR = r"\(\(?signed char\)\s*(-?\d+)\)?"


_PACKED_CHARS = re.compile(r"make_int([24])\(\s*(" + _CHAR + r"(?:\s*,\s*" + _CHAR + r")*)\s*\)")


def fix_int8_vector_constants(code: str) -> str:
    """Repair TVM 0.27's CUDA codegen for constant int8 vectors of 8 and 16 lanes: it prints
    ``make_int4((signed char)0, ... 16 values)`` (e.g. the zero a padded convolution's 16-byte activation
    load takes outside the image), which does not compile. Each group of 4 chars becomes the int holding
    those bytes (little-endian), so the vector keeps its bits.

    Remove when: TVM prints int8 vector constants that compile (the guard test
    ``test_guard_tvm_still_prints_16_char_int8_constants`` then fails)."""

    def packed(m: re.Match) -> str:
        n = int(m.group(1))
        values = [int(v) for v in re.findall(_CHAR, m.group(2))]
        if len(values) != 4 * n:
            return m.group(0)
        words = []
        for i in range(0, len(values), 4):
            word = sum((v & 0xFF) << (8 * k) for k, v in enumerate(values[i : i + 4]))
            words.append(str(word - (1 << 32) if word >= 1 << 31 else word))
        return f"make_int{n}({', '.join(words)})"

    return _PACKED_CHARS.sub(packed, code)


_PACK8 = "__inferx_pack8"
_PACK8_HELPER = (
    "template <typename T> __device__ __forceinline__ uint4 " + _PACK8 + "(T a0, T a1, T a2, T a3, T a4, T a5,"
    ' T a6, T a7) {\n  static_assert(sizeof(T) == 2, "8 x 16-bit lanes");\n  uint4 r;\n  T* p = (T*)&r;\n'
    "  p[0] = a0; p[1] = a1; p[2] = a2; p[3] = a3; p[4] = a4; p[5] = a5; p[6] = a6; p[7] = a7;\n  return r;\n}\n"
)


def _top_level_args(code: str, open_at: int) -> list[str]:
    """The comma-separated arguments of the call whose ``(`` is at ``code[open_at]``."""
    end = _close(code, open_at)
    args, depth, start = [], 0, open_at + 1
    for i in range(open_at + 1, end):
        c = code[i]
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif c == "," and depth == 0:
            args.append(code[start:i])
            start = i + 1
    args.append(code[start:end])
    return args


def fix_gathered_half8_packs(code: str) -> str:
    """Repair TVM 0.27's CUDA codegen for an 8-lane fp16 (or bf16) vector loaded by a gather (each lane
    at its own computed index, e.g. a broadcast read in a fused squeeze-excite kernel): it prints
    ``make_uint4(x[i0], ..., x[i7])`` with eight 16-bit arguments, which does not compile ("too many
    arguments"; EfficientNet fp16 for sm_87/sm_90). The call becomes a helper that stores the eight
    lanes into the uint4's bytes, so the vector keeps its bits.

    Remove when: TVM packs such gathers in compilable code (the guard test
    ``test_guard_tvm_still_packs_gathered_half8_with_make_uint4`` then fails)."""
    out, i, changed = [], 0, False
    while True:
        j = code.find("make_uint4(", i)
        if j < 0:
            break
        open_at = j + len("make_uint4")
        try:
            args = _top_level_args(code, open_at)
            end = _close(code, open_at)
        except ValueError:
            break
        if len(args) == 8:
            out += [code[i:j], _PACK8, code[open_at : end + 1]]
            changed = True
        else:
            out.append(code[i : end + 1])
        i = end + 1
    out.append(code[i:])
    if not changed:
        return code
    patched = "".join(out)
    # the helper goes after the includes TVM emits (cuda_fp16.h defines half)
    k = patched.find("\n", patched.rfind("#include"))
    return patched[: k + 1] + _PACK8_HELPER + patched[k + 1 :]


_OWN_LANE_SHUFFLE = "__shfl_sync(__activemask(), "


_OWN_LANE_TAIL = re.compile(r"\s*\(\(int\)threadIdx\.x\), 32\)")


def drop_own_lane_shuffles(code: str) -> str:
    """Replace ``__shfl_sync(__activemask(), v, ((int)threadIdx.x), 32)`` by ``v``. TVM 0.27 lowers
    every read of a "warp" buffer (the tensor-core accumulators) to a shuffle from the lane the index
    names; the accumulator store reads each thread's own values (lane ``threadIdx.x``, width 32,
    which TVM emits only where threadIdx.x spans whole warps, so the source lane is the thread's own)
    and so paid 128 shuffles per thread for a 64x64 warp tile. Without them nvcc also merges the
    stores into 8-byte ones. (TVM's ``mma_store`` builtin gives the same PTX but fails to lower for some
    convolutions, hence a source repair.)

    Remove when: TVM reads a thread's own warp-buffer values without a shuffle (the guard test
    ``test_int8_accumulators_leave_registers_without_warp_shuffles`` then fails)."""
    out, pos = [], 0
    while (start := code.find(_OWN_LANE_SHUFFLE, pos)) >= 0:
        i, depth = start + len(_OWN_LANE_SHUFFLE), 0
        while i < len(code) and (depth or code[i] != ","):  # the value: up to its top-level comma
            depth += code[i] in "([{"
            depth -= code[i] in ")]}"
            if depth < 0:
                break
            i += 1
        tail = _OWN_LANE_TAIL.match(code, i + 1) if i < len(code) and code[i] == "," else None
        if tail is None:
            out.append(code[pos : start + len(_OWN_LANE_SHUFFLE)])
            pos = start + len(_OWN_LANE_SHUFFLE)
            continue
        out.append(code[pos:start] + "(" + code[start + len(_OWN_LANE_SHUFFLE) : i].strip() + ")")
        pos = tail.end()
    return "".join(out) + code[pos:]


_FOR = re.compile(r"for \(int (\w+) = 0; \1 < (\d+); \+\+\1\) \{")


_WAIT = re.compile(r"tvm_builtin_ptx_cp_async_wait_group_async_wait_group_(\d+)\(\);")


_COMMIT = "tvm_builtin_ptx_cp_async_commit_group_async_commit_group();"


_DECL = re.compile(r"(int|unsigned|uint|signed char|char|long|bool|half|float|int[24]|uint[24])\s+\w+\s*(=|;|\[)")


_SYNC = "__syncthreads();"


def _rewrite_pipelined_loop(body: str) -> str | None:
    """:func:`interleave_pipelined_copies` for one loop body, or None when it is not TVM's cp.async
    pipeline loop (see there)."""
    stmts = _statements(body)
    try:
        top = stmts.index(_SYNC)
        commit = stmts.index(_COMMIT)
        wait = next(n for n, s in enumerate(stmts) if _WAIT.fullmatch(s))
    except (ValueError, StopIteration):
        return None
    wait_n = int(_WAIT.fullmatch(stmts[wait]).group(1))
    if not top < commit < wait or stmts[wait + 1 : wait + 2] != [_SYNC] or wait_n < 2:
        return None  # (wait_n < 2: two buffers, see interleave_pipelined_copies)
    head, copies, mid, compute = stmts[:top], stmts[top + 1 : commit], stmts[commit + 1 : wait], stmts[wait + 2 :]
    if not all(_DECL.match(s) for s in head + mid) or not copies:
        return None
    if any(_DECL.match(s) for s in copies) or any(
        _SYNC in s or _COMMIT in s or "wait_group" in s for s in copies + compute
    ):
        return None
    steps_at = next((n for n, s in enumerate(compute) if s.startswith("for ")), None)
    step = _FOR.match(compute[steps_at]) if steps_at is not None else None
    if step is None or int(step.group(2)) < 2:
        return None
    var, steps = step.group(1), int(step.group(2))
    spread, first = [], []
    for s in copies:
        loop = _FOR.match(s)
        inner = _statements(s[loop.end() : _close(s, loop.end() - 1)]) if loop else []
        if loop and inner and all(x.startswith("ptx_cp_async") or _DECL.match(x) for x in inner):
            v, n = loop.group(1), int(loop.group(2))
            per = -(-n // steps)
            end = f"{var} * {per} + {per}" if per * steps == n else f"min({var} * {per} + {per}, {n})"
            spread.append(f"for (int {v} = {var} * {per}; {v} < {end}; ++{v}) {{" + s[loop.end() :])
        else:  # synchronous loads (predicated activations) and single copies: right after the barrier
            first.append(s)
    if not spread:
        return None
    loop_text = compute[steps_at]
    opened = _FOR.match(loop_text).end()
    compute[steps_at] = loop_text[:opened] + "\n" + "\n".join(spread) + loop_text[opened:]
    new = [*head, *mid, f"tvm_builtin_ptx_cp_async_wait_group_async_wait_group_{wait_n - 1}();", _SYNC]
    return "\n".join(new + first + compute + [_COMMIT]) + "\n"


def interleave_pipelined_copies(code: str) -> tuple[str, int]:
    """Rewrite the main loop of TVM's cp.async pipeline (:attr:`~inferx_edge.compiler.cuda.
    TileConfig.pipeline`) the way CUTLASS's multistage GEMMs run it; returns the source and how many
    loops changed. TVM 0.27 emits, per shared-memory stage k::

        __syncthreads(); <copies of stage k+L>; commit; wait_group(L); __syncthreads(); <math of stage k>

    with every copy issued in one burst ahead of the math and two barriers. Rewritten::

        wait_group(L-1); __syncthreads(); <math of stage k, each 32-deep step issuing its share of
        the cp.async copies of stage k+L>; commit

    Exact by the same argument as CUTLASS's: after the one barrier stage k has landed for every warp,
    and every warp has finished stage k-1's math, whose buffer ((k+L) mod (L+1)) the copies refill.
    Only for L >= 2 (``async3``, ``async4``): the copies of stage k+L now start after stage k has landed
    instead of before, which costs nothing with another stage in flight but exposed the load latency
    with two buffers (L = 1, ``async``, measured slower rewritten): those loops are left alone.
    Copy loops that are not plain cp.async (the predicated synchronous loads of a padded convolution's
    input) and single copies go right after the barrier instead. A loop that does not have exactly
    this shape (no cp.async pipeline, one 32-deep step per stage, anything unexpected) is left as it is.
    The A/B measurement is ``gpu_int8_matmul_h200_compare2*`` (benchmarks/README.md).

    Remove when: TVM's software pipeline can spread a stage's copies over the inner loop with one
    barrier (the guard in ``test_pipelined_copies_are_spread_over_the_math_steps`` then fails)."""
    out, pos, changed = [], 0, 0
    for m in re.finditer(r"for \(int (\w+) = 0; \1 < \d+; \+\+\1\) \{", code):
        if m.start() < pos or _COMMIT not in code[m.end() : m.end() + 20000]:
            continue
        try:
            end = _close(code, m.end() - 1)
            new = _rewrite_pipelined_loop(code[m.end() : end])
        except (ValueError, IndexError):
            new = None
        if new is None:
            continue
        out.append(code[pos : m.end()] + "\n" + new)
        pos, changed = end, changed + 1
    return "".join(out) + code[pos:], changed
