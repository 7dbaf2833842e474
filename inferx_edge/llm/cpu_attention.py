"""CPU decode attention over the paged KV cache: one query token per sequence, parallel over (sequence,
query head), a page of keys at a time in vector registers.

TVM's CPU kernel (``batch_decode_paged_kv_cpu`` of ``tvm.relax.frontend.nn.llm``) is one serial loop
nest: every key row is read element by element behind a per-element rotary-mode branch, and the online
softmax calls ``exp2`` once per row. On SmolLM2-135M it took a fifth of a decode step on one core, all
of it on one core with two (it is not parallel). This kernel computes the same thing (the same online
softmax, blocked by page: one rescale per page instead of per row, the page's exponentials in vector
registers: ``exp`` is lowered to a vector polynomial on CPUs, ``exp2`` is a libm call per row) for the
case the LLM path builds:
rotary embedding applied before the cache (``RopeMode.NORMAL``, so ``rotary_mode`` is 0; another value
fails with a clear message), no sliding window. :func:`use_fast_decode_attention` swaps it into a module
in place of TVM's kernel; every other CPU attention kernel is left as TVM writes it.
"""

from __future__ import annotations

import math

from tvm.script import tirx as T

SYMBOL = "batch_decode_paged_kv_cpu"
#: the page size TVM's paged KV cache compiles its CPU kernels for (``_attention_decode_cpu``'s default)
PAGE_SIZE = 16
LOG2E = math.log2(math.e)


def decode_attention(num_kv_heads: int, num_qo_heads: int, head_dim: int, dtype: str, page_size: int):
    """The PrimFunc, with the signature and global symbol of TVM's ``batch_decode_paged_kv_cpu``."""
    H_qo, H_kv, D = num_qo_heads, num_kv_heads, head_dim
    G = H_qo // H_kv
    L = math.gcd(D, 16)  # vector lanes of the dot products and the output update
    P = page_size

    @T.prim_func(s_tir=True)
    def batch_decode_paged_kv(
        Q_handle: T.handle,
        pages_handle: T.handle,
        page_table_indptr_handle: T.handle,
        page_table_values_handle: T.handle,
        var_length_info: T.handle,
        k_rope_pos_offset_handle: T.handle,
        q_rope_position_handle: T.handle,
        output_handle: T.handle,
        lse_handle: T.handle,
        rotary_mode: T.int32,
        rope_scale: T.float32,
        rope_theta: T.float32,
        sm_scale: T.float32,
    ):
        T.func_attr({"tirx.is_scheduled": True, "global_symbol": SYMBOL})
        B = T.int32()
        nnz_pages = T.int32()
        max_num_pages = T.int32()
        page_indptr_elem_offset = T.int32()
        page_values_elem_offset = T.int32()
        k_rope_pos_offset_elem_offset = T.int32()
        q_rope_position_elem_offset = T.int32()
        length_info_elem_offset = T.int32()

        Q = T.match_buffer(Q_handle, (B, H_qo, D), dtype)
        pages = T.match_buffer(pages_handle, (max_num_pages, 2, H_kv, P, D), dtype)
        page_table_indptr = T.match_buffer(
            page_table_indptr_handle, (B + 1,), "int32", elem_offset=page_indptr_elem_offset
        )
        page_table_values = T.match_buffer(
            page_table_values_handle, (nnz_pages,), "int32", elem_offset=page_values_elem_offset
        )
        k_rope_pos_offset = T.match_buffer(  # noqa: F841  (rotary embedding is applied before the cache)
            k_rope_pos_offset_handle, (B,), "int32", elem_offset=k_rope_pos_offset_elem_offset
        )
        q_rope_position = T.match_buffer(  # noqa: F841
            q_rope_position_handle, (B,), "int32", elem_offset=q_rope_position_elem_offset
        )
        output = T.match_buffer(output_handle, (B, H_qo, D), dtype)
        lse = T.match_buffer(lse_handle, (B, H_qo), "float32")
        length_info = T.match_buffer(var_length_info, (B,), "int32", elem_offset=length_info_elem_offset)

        T.Assert(
            rotary_mode == 0, "the inferx_edge CPU decode attention expects rotary embedding applied before the cache"
        )
        for bh in T.parallel(B * H_qo):
            with T.sblock("attn"):
                vb: T.let[T.int32] = bh // H_qo
                h: T.let[T.int32] = bh % H_qo
                q = T.sblock_alloc_buffer((D,), "float32")
                o = T.sblock_alloc_buffer((D,), "float32")
                s = T.sblock_alloc_buffer((P,), "float32")
                part = T.sblock_alloc_buffer((L,), "float32")
                state = T.sblock_alloc_buffer((4,), "float32")  # running max, running sum, page max, rescale
                pos = T.sblock_alloc_buffer((5,), "int32")  # first page entry, pages, keys, keys on page, page
                pos[0] = page_table_indptr[vb]
                pos[1] = page_table_indptr[vb + 1] - pos[0]
                pos[2] = T.if_then_else(pos[1] > 0, (pos[1] - 1) * P + length_info[vb], 0)
                for d in T.vectorized(D):
                    q[d] = T.Cast("float32", Q[vb, h, d]) * sm_scale
                    o[d] = T.float32(0)
                state[0] = T.float32(-5e4 / LOG2E)  # TVM's start, -5e4 in log2 units
                state[1] = T.float32(1)
                for p in T.serial(pos[1]):
                    pos[3] = T.min(P, pos[2] - p * P)
                    pos[4] = page_table_values[pos[0] + p]
                    # every row's score (rows past the sequence's end read stale keys: masked below)
                    for r in T.serial(P):
                        for ln in T.vectorized(L):
                            part[ln] = T.float32(0)
                        for d0 in T.serial(D // L):
                            for ln in T.vectorized(L):
                                part[ln] = part[ln] + q[d0 * L + ln] * T.Cast(
                                    "float32", pages[pos[4], 0, h // G, r, d0 * L + ln]
                                )
                        s[r] = T.float32(0)
                        for ln in T.serial(L):
                            s[r] = s[r] + part[ln]
                    for r in T.vectorized(P):
                        s[r] = T.if_then_else(r < pos[3], s[r], T.float32(-1e30))
                    state[2] = state[0]
                    for r in T.serial(P):
                        state[2] = T.max(state[2], s[r])
                    state[3] = T.exp(state[0] - state[2])
                    for r in T.vectorized(P):
                        s[r] = T.exp(s[r] - state[2])  # in vector registers (compiler.tvm_ops)
                    state[1] = state[1] * state[3]
                    for r in T.serial(P):
                        state[1] = state[1] + s[r]
                    for d in T.vectorized(D):
                        o[d] = o[d] * state[3]
                    state[0] = state[2]
                    for r in T.serial(pos[3]):
                        for d in T.vectorized(D):
                            o[d] = o[d] + s[r] * T.Cast("float32", pages[pos[4], 1, h // G, r, d])
                for d in T.vectorized(D):
                    output[vb, h, d] = T.Cast(dtype, o[d] / state[1])
                lse[vb, h] = state[0] * LOG2E + T.log2(state[1])  # log2 units, as TVM's kernels report it

    return batch_decode_paged_kv


def use_fast_decode_attention(mod, num_kv_heads: int, num_qo_heads: int, head_dim: int, dtype: str):
    """``mod`` with TVM's CPU decode attention (the non-sliding-window kernel) replaced by
    :func:`decode_attention` for these heads; unchanged when it has none (a GPU module)."""
    from tvm import tirx

    for gv, func in list(mod.functions.items()):
        if isinstance(func, tirx.PrimFunc) and func.attrs is not None:
            if str(func.attrs.get("global_symbol", "")) == SYMBOL:
                mod[gv] = decode_attention(num_kv_heads, num_qo_heads, head_dim, dtype, PAGE_SIZE)
    return mod
