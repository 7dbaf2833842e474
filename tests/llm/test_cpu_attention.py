"""The CPU decode attention kernel against TVM's own (``batch_decode_paged_kv_cpu``) on random paged KV
data: sequences shorter than a page, exactly a page and spanning partial pages, pages out of order,
grouped query heads; the LLM build swaps it in for CPU targets."""

from __future__ import annotations

import numpy as np
import pytest

tvm = pytest.importorskip("tvm")


def _run(func, args):
    lib = tvm.compile(tvm.IRModule({"main": func}), target="llvm")
    lib["batch_decode_paged_kv_cpu"](*args)


@pytest.mark.parametrize("heads", [(2, 6, 64), (1, 1, 16), (3, 9, 48)])
def test_matches_tvms_kernel(heads):
    from tvm.relax.frontend.nn.llm._decode_kernels import _attention_decode_cpu

    from inferx_edge.llm.cpu_attention import PAGE_SIZE, decode_attention

    h_kv, h_qo, d = heads
    rng = np.random.default_rng(0)
    lengths = [1, PAGE_SIZE, 37, 0]
    n_pages = [(n + PAGE_SIZE - 1) // PAGE_SIZE for n in lengths]
    order = rng.permutation(sum(n_pages) + 2).astype(np.int32)  # pages of a sequence are not adjacent
    indptr = np.concatenate([[0], np.cumsum(n_pages)]).astype(np.int32)
    values = order[: indptr[-1]]
    last = np.array([(n - 1) % PAGE_SIZE + 1 if n else 0 for n in lengths], np.int32)
    b = len(lengths)
    q = rng.standard_normal((b, h_qo, d)).astype(np.float32)
    pages = rng.standard_normal((len(order), 2, h_kv, PAGE_SIZE, d)).astype(np.float32)
    zeros = np.zeros(b, np.int32)
    dev = tvm.cpu()
    outs = {}
    for name, func in (
        ("tvm", _attention_decode_cpu(h_kv, h_qo, d, "float32", False, {})),
        ("ours", decode_attention(h_kv, h_qo, d, "float32", PAGE_SIZE)),
    ):
        out = tvm.runtime.empty((b, h_qo, d), "float32", dev)
        lse = tvm.runtime.empty((b, h_qo), "float32", dev)
        arrays = [tvm.runtime.tensor(a, dev) for a in (q, pages, indptr, values, last, zeros, zeros)]
        _run(func, [*arrays, out, lse, 0, 1.0, 1e4, 1.0 / np.sqrt(d)])
        outs[name] = out.numpy(), lse.numpy()
    np.testing.assert_allclose(outs["ours"][0], outs["tvm"][0], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(outs["ours"][1], outs["tvm"][1], rtol=1e-5, atol=1e-4)


def test_refuses_rotary_embedding_in_the_kernel():
    from inferx_edge.llm.cpu_attention import PAGE_SIZE, decode_attention

    dev = tvm.cpu()
    f = decode_attention(1, 1, 16, "float32", PAGE_SIZE)
    args = [
        tvm.runtime.tensor(a, dev)
        for a in (
            np.zeros((1, 1, 16), np.float32),
            np.zeros((1, 2, 1, PAGE_SIZE, 16), np.float32),
            np.array([0, 1], np.int32),
            np.array([0], np.int32),
            np.array([1], np.int32),
            np.zeros(1, np.int32),
            np.zeros(1, np.int32),
        )
    ]
    out, lse = tvm.runtime.empty((1, 1, 16), "float32", dev), tvm.runtime.empty((1, 1), "float32", dev)
    with pytest.raises(Exception, match="rotary embedding applied before the cache"):
        _run(f, [*args, out, lse, 1, 1.0, 1e4, 0.25])


def test_the_cpu_llm_module_gets_it(tiny_llama):
    from inferx_edge.compiler.compile import resolve_tvm_target
    from inferx_edge.llm.build import export_model
    from inferx_edge.llm.checkpoint import load_checkpoint
    from inferx_edge.llm.cpu_attention import SYMBOL, use_fast_decode_attention
    from inferx_edge.targets import get_target

    cfg = load_checkpoint(tiny_llama).config
    spec = get_target("x86-cpu")
    mod, _, _, dtype, _ = export_model(cfg, "fp32", spec, resolve_tvm_target(spec), None)
    before = [f for f in mod.functions.values() if f.attrs is not None and f.attrs.get("global_symbol") == SYMBOL]
    assert len(before) == 1 and "T.parallel" not in before[0].script()
    mod = use_fast_decode_attention(mod, cfg.num_key_value_heads, cfg.num_attention_heads, cfg.head_dim, dtype)
    after = [f for f in mod.functions.values() if f.attrs is not None and f.attrs.get("global_symbol") == SYMBOL]
    assert len(after) == 1 and "T.parallel" in after[0].script()
