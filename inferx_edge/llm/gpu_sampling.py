"""Greedy sampling on the GPU: each row's argmax, so a decode step returns token ids, not logits.

A batch of 32 sequences has 32 x 49,152 float32 logits (6.3 MB) per step on SmolLM2; copying them to
the host and taking the argmax there cost about as much as the step's kernels. :func:`argmax_rows` is
one thread block per row: each thread keeps the best of a strided slice, then a shared-memory tree
halves the candidates; ties go to the lowest index, as ``numpy.argmax`` decides them (greedy
continuations stay identical to the host path).
"""

from __future__ import annotations

from tvm.script import tirx as T

THREADS = 1024


def argmax_rows(vocab: int, threads: int = THREADS):
    """PrimFunc ``(logits [b, 1, vocab] f32, out [b] i32)``: ``out[i] = argmax(logits[i, 0])``."""
    steps = threads.bit_length() - 1
    if threads != 1 << steps:
        raise ValueError(f"threads must be a power of two, got {threads}")
    per_thread = (vocab + threads - 1) // threads

    @T.prim_func(s_tir=True)
    def argmax(logits_h: T.handle, out_h: T.handle):
        T.func_attr({"tirx.is_scheduled": True, "tirx.noalias": True})
        b = T.int64()
        logits = T.match_buffer(logits_h, (b, 1, vocab), "float32")
        out = T.match_buffer(out_h, (b,), "int32")
        for row in T.thread_binding(b, thread="blockIdx.x"):
            with T.sblock("row"):
                sv = T.sblock_alloc_buffer((threads,), "float32", scope="shared")
                si = T.sblock_alloc_buffer((threads,), "int32", scope="shared")
                # each thread's pair, indexed by thread so the buffer lowers to per-thread registers
                v = T.sblock_alloc_buffer((threads * 2,), "float32", scope="local")
                i = T.sblock_alloc_buffer((threads * 2,), "int32", scope="local")
                for tx in T.thread_binding(threads, thread="threadIdx.x"):
                    with T.sblock("scan"):
                        best = T.sblock_alloc_buffer((1,), "float32", scope="local")
                        where = T.sblock_alloc_buffer((1,), "int32", scope="local")
                        best[0] = T.float32(-3.4e38)
                        where[0] = T.int32(vocab)
                        for k in T.serial(per_thread):
                            if k * threads + tx < vocab:
                                # strictly greater: this thread's slice is read in increasing index order
                                if logits[row, 0, k * threads + tx] > best[0] or where[0] == vocab:
                                    best[0] = logits[row, 0, k * threads + tx]
                                    where[0] = T.Cast("int32", k * threads + tx)
                        sv[tx] = best[0]
                        si[tx] = where[0]
                for s in T.unroll(steps):  # halve the candidates; the lower index wins a tie
                    for tx in T.thread_binding(threads, thread="threadIdx.x"):
                        with T.sblock("read"):  # the pair to a thread's registers, then a barrier
                            if tx < T.shift_right(threads, s + 1):
                                v[tx * 2] = sv[tx + T.shift_right(threads, s + 1)]
                                i[tx * 2] = si[tx + T.shift_right(threads, s + 1)]
                                v[tx * 2 + 1] = sv[tx]
                                i[tx * 2 + 1] = si[tx]
                    for tx in T.thread_binding(threads, thread="threadIdx.x"):
                        with T.sblock("write"):
                            if tx < T.shift_right(threads, s + 1):
                                if v[tx * 2] > v[tx * 2 + 1] or (
                                    v[tx * 2] == v[tx * 2 + 1] and i[tx * 2] < i[tx * 2 + 1]
                                ):
                                    sv[tx] = v[tx * 2]
                                    si[tx] = i[tx * 2]
                for tx in T.thread_binding(threads, thread="threadIdx.x"):
                    with T.sblock("store"):
                        if tx == 0:
                            out[row] = si[0]

    return argmax.without_attr("global_symbol")
