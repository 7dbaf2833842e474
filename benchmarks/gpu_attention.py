"""Attention of the zoo's transformers on one GPU: the fused kernel against torch in one process.

    python -m benchmarks.gpu_attention [--batches 64,1] [--name NAME] [--no-check]

First the kernel's numerics on the device against numpy float64 (:data:`CHECKS`: ragged lengths, head
widths 16-128, broadcast biases, rows masked everywhere, Q/K/V read from one packed float32 tensor).

Each case is ``softmax(Q K^T * scale + bias) V`` at a zoo network's shapes (fp16 Q/K/V already laid out
[batch x heads, tokens, head width], fp32 output as an int8 variant's kernel writes it):
:func:`~inferx_edge.compiler.cuda.attention.attention_kernel` timed with TVM's time evaluator; torch
(fp16, CUDA events) as ``F.scaled_dot_product_attention`` (its fused backends; a float mask where the
case has a bias) and as the three-kernel ``matmul -> softmax -> matmul`` an unfused graph runs. The
outputs are checked against numpy float64 (first 64 sequences). Writes ``results/<name>.json``.
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from benchmarks._record import gpu_driver, versions, write_record

#: (network, heads, tokens, head width, bias shape per image: None, "window" (Swin: heads x T x T per
#: window group), "mask" (BERT padding: 1 x 1 x T))
CASES = [
    ("vit_b_16", 12, 197, 64, None),
    ("swin_t stage 1", 3, 49, 32, "window"),
    ("swin_t stage 3", 12, 49, 32, "window"),
    ("minilm_l6", 12, 128, 32, "mask"),
]
#: Swin-T windows per image at stages 1 and 3 (56/7)^2 and (14/7)^2
_WINDOWS = {"swin_t stage 1": 64, "swin_t stage 3": 4}


def reference(q, k, v, scale: float, bias=None):
    """numpy float64 ``softmax(q k^T * scale + bias) v`` over [sequences, tokens, width] operands."""
    s = np.einsum("nsd,ntd->nst", q.astype(np.float64), k.astype(np.float64)) * scale
    if bias is not None:
        s = s + bias
    with np.errstate(invalid="ignore"):  # a row masked everywhere is NaN here (callers zero it)
        p = np.exp(s - s.max(-1, keepdims=True))
    return np.einsum("nst,ntd->nsd", p / p.sum(-1, keepdims=True), v.astype(np.float64))


#: int8 codes per unit of the ``merged`` checks' output (the kernel quantizes as it stores)
MERGED_SCALE = 40.0


def _setup(
    nb, s, t, d, dv, scale, bias=None, view=None, out_dtype="float32", seed=0, packed=False, target="h200", cpu=False,
    merged=0,
):  # fmt: skip
    """The compiled kernel (``cpu``: its TE twin for this CPU) on seeded inputs: ``(lib, device
    arguments, output, fp16 (q, k, v), full bias [nb, S|1, T] or None)``. fp16 Q, K, V tensors;
    ``packed`` (s == t, d == dv): one float32 [s, nb, 3 * d] tensor holding all three, as a QKV
    projection writes it, read through index maps. ``merged`` (heads): the output written int8
    (:data:`MERGED_SCALE`) as [nb / heads, s, heads, dv]."""
    import tvm

    from inferx_edge.compiler.cuda.attention import Bias, Operand, Store, attention_kernel
    from inferx_edge.compiler.cuda.attention_reference import attention_reference

    rng = np.random.default_rng(seed)
    operands = None
    if packed:
        base = rng.standard_normal((s, nb, 3 * d)).astype(np.float32)
        q, k, v = (base[:, :, i * d : (i + 1) * d].transpose(1, 0, 2).astype(np.float16) for i in range(3))
        operands = tuple(Operand(base.shape, "float32", lambda n, r, c, i=i: (r, n, i * d + c), 4) for i in range(3))
        inputs = [base, base, base]
    else:
        q, k, v = (rng.standard_normal(shape).astype(np.float16) for shape in ((nb, s, d), (nb, t, d), (nb, t, dv)))
        inputs = [q, k, v]
    spec_b = Bias(bias.shape, view, "float32") if bias is not None else None
    factory = attention_reference if cpu else attention_kernel
    store = Store(merged, MERGED_SCALE) if merged else Store()
    out_dtype = "int8" if merged else out_dtype
    f = factory(nb, s, t, d, dv, scale, out_dtype, spec_b, operands, store=store)
    if cpu:
        lib, dev = (
            tvm.compile(tvm.IRModule({"attention": f.with_attr("global_symbol", "attention")}), target="llvm"),
            tvm.cpu(),
        )
    else:
        lib, dev = _compile(f, target), tvm.cuda()
    b = bias.astype(np.float32).reshape(-1) if bias is not None else np.zeros(1, np.float32)
    args = [tvm.runtime.tensor(a, dev) for a in (*inputs, b)]
    out = tvm.runtime.empty(store.shape(nb, s, dv), out_dtype, dev)
    full = None
    if bias is not None:
        full = np.broadcast_to(bias, (*view, *bias.shape[-2:])).reshape(nb, *bias.shape[-2:])
    return lib, args, out, (q, k, v), full


def run_kernel(
    nb, s, t, d, dv, scale, bias=None, view=None, out_dtype="float32", seed=0, packed=False, cpu=False, merged=0
):
    """Compile and run the kernel on GPU 0 (``cpu``: its TE twin on this CPU) with seeded inputs (see
    :func:`_setup`): ``(output, float64 reference)``, both [nb, s, dv] (``merged``: the int8 codes
    unmerged and scaled back, the reference rounded to the same codes)."""
    lib, args, out, (q, k, v), full = _setup(
        nb, s, t, d, dv, scale, bias, view, out_dtype, seed, packed, cpu=cpu, merged=merged
    )
    lib["attention"](*args, out)
    got, want = out.numpy().astype(np.float64), reference(q, k, v, scale, full)
    if merged:
        got = got.reshape(nb // merged, s, merged, dv).transpose(0, 2, 1, 3).reshape(nb, s, dv) / MERGED_SCALE
        want = np.clip(np.round(want * MERGED_SCALE), -127, 127) / MERGED_SCALE
    return got, want


def run_case(case, batch: int, target: str) -> dict:
    import torch
    import torch.nn.functional as F
    import tvm

    from benchmarks.gpu_grouped_conv import torch_us

    net, heads, tokens, width, kind = case
    windows = _WINDOWS.get(net, 1)
    nb = batch * windows * heads
    rng = np.random.default_rng(1)
    scale = width**-0.5
    bias, view = None, (nb,)
    if kind == "window":
        bias = rng.standard_normal((1, windows, heads, tokens, tokens)).astype(np.float32)
        view = (batch, windows, heads)
    elif kind == "mask":
        bias = np.zeros((batch, 1, 1, tokens), np.float32)
        bias[:, :, :, tokens * 3 // 4 :] = -10000.0  # a quarter of each sequence is padding
        view = (batch, heads)
    row = {"network": net, "batch": batch, "sequences": nb, "tokens": tokens, "head width": width}
    row["gflop"] = 4 * nb * tokens * tokens * width / 1e9
    row["bias"] = kind

    lib, args, out, (q, k, v), full = _setup(nb, tokens, tokens, width, width, scale, bias, view, target=target)
    lib["attention"](*args, out)
    m = min(nb, 64)
    want = reference(q[:m], k[:m], v[:m], scale, None if full is None else full[:m])
    row["max abs error vs float64"] = float(np.abs(out.numpy()[:m] - want).max())
    timer = lib.mod.time_evaluator("attention", tvm.cuda(0), number=10, repeat=5, min_repeat_ms=50)
    row["inferx fused us"] = float(np.median(timer(*args, out).results)) * 1e6

    # 4-D [1, sequences, tokens, width] operands: torch's fused SDPA backends (flash, memory-efficient,
    # cuDNN) take only 4-D inputs; 3-D ones run its math backend (unfused, fp32 softmax)
    tq, tk, tv = (torch.from_numpy(np.ascontiguousarray(a)).cuda()[None] for a in (q, k, v))
    tb = None if full is None else torch.from_numpy(np.ascontiguousarray(full)).cuda().half()[None]
    with torch.inference_mode():
        row["torch sdpa fp16 us"] = torch_us(lambda: F.scaled_dot_product_attention(tq, tk, tv, attn_mask=tb))

        def unfused():
            s = torch.matmul(tq, tk.transpose(-1, -2)) * scale
            if tb is not None:
                s = s + tb
            return torch.matmul(torch.softmax(s, -1), tv)

        row["torch unfused fp16 us"] = torch_us(unfused)
    row["inferx TFLOPS"] = row["gflop"] / row["inferx fused us"] * 1e3
    for peer in ("torch sdpa fp16", "torch unfused fp16"):
        row[f"inferx / {peer} (time ratio)"] = row["inferx fused us"] / row[f"{peer} us"]
    return row


def _compile(func, target: str):
    import tvm

    from inferx_edge.compiler.compile import resolve_tvm_target
    from inferx_edge.compiler.cuda import device_compiler
    from inferx_edge.targets import get_target

    spec = get_target(target)
    tgt = resolve_tvm_target(spec)
    with device_compiler(spec, "cubin"), tgt:
        return tvm.compile(tvm.IRModule({"attention": func.with_attr("global_symbol", "attention")}), target=tgt)


def _masked_rows():
    bias = np.zeros((2, 20, 30))
    bias[0, 3, :] = -np.inf  # query 3 of sequence 0 sees nothing: zeros
    bias[1, :, 7] = -np.inf  # key 7 of sequence 1 is padding
    return bias


#: the numerics checks (``--check``): (label, run_kernel arguments, keyword arguments)
CHECKS = [
    ("vit shape", (6, 197, 197, 64, 64, 0.125), {}),
    ("ragged, 32 wide", (4, 50, 130, 32, 32, 0.2), {}),
    ("128 wide", (2, 5, 77, 128, 128, 0.09), {}),
    ("3 keys, 16/48 wide", (3, 70, 3, 16, 48, 0.25), {}),
    ("one token", (1, 1, 1, 64, 16, 0.125), {}),
    ("window bias", (12, 49, 49, 32, 32, 0.2), {"bias": "window", "view": (4, 3)}),
    ("padding mask", (12, 49, 49, 32, 32, 0.2), {"bias": "mask", "view": (4, 3)}),
    ("masked rows, fp16 out", (2, 20, 30, 16, 16, 0.5), {"bias": "masked", "view": (2,), "out_dtype": "float16"}),
    ("packed fp32 qkv", (24, 197, 197, 64, 64, 0.125), {"packed": True}),
    ("int8 out, heads merged", (24, 197, 197, 64, 64, 0.125), {"packed": True, "merged": 12}),
]


def check(label: str, args, kwargs, cpu: bool = False) -> dict:
    """One numerics check on the GPU (``cpu``: of the TE twin on this CPU): max error relative to the
    reference's largest value (<= 3e-3: OK)."""
    rng = np.random.default_rng(1)
    kwargs = dict(kwargs)
    bias = {
        "window": lambda: rng.standard_normal((1, 3, 49, 49)) * 3,
        "mask": lambda: np.where(rng.random((4, 1, 1, 49)) < 0.25, -10000.0, 0.0),
        "masked": _masked_rows,
    }.get(kwargs.get("bias"))
    if bias is not None:
        kwargs["bias"] = bias()
    got, want = run_kernel(*args, **kwargs, cpu=cpu)
    if kwargs.get("bias") is not None and np.isinf(kwargs["bias"]).any():
        want = np.nan_to_num(want, nan=0.0)  # a row that sees nothing: the kernel writes zeros
    err = float(np.abs(got - want).max() / max(1.0, np.abs(want).max()))
    # an int8 code may sit one step off where the value lies on a rounding boundary
    tol = 3e-3 + (1 / MERGED_SCALE if kwargs.get("merged") else 0.0)
    ok = bool(np.isfinite(got).all()) and err <= tol
    return {"check": label, "shape": list(args[:5]), "rel max error": err, "ok": ok}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", default="64,1")
    ap.add_argument("--target", default="h200")
    ap.add_argument("--name", default=None)
    ap.add_argument("--no-check", action="store_true", help="skip the numerics checks against float64")
    args = ap.parse_args()
    import torch

    results: list[dict] = []
    checks: list[dict] = []
    for label, a, kw in [] if args.no_check else CHECKS:
        try:
            checks.append(check(label, a, kw))
        except Exception as exc:  # recorded, the other checks still run
            checks.append({"check": label, "ok": False, "error": f"{type(exc).__name__}: {exc}"[:600]})
        print(json.dumps(checks[-1]), flush=True)
    for batch in (int(b) for b in args.batches.split(",")):
        for case in CASES:
            try:
                row = run_case(case, batch, args.target)
            except Exception as exc:  # recorded, the other cases still run
                row = {"network": case[0], "batch": batch, "error": f"{type(exc).__name__}: {exc}"[:600]}
            results.append(row)
            print(json.dumps(row), flush=True)
    checks_ok = all(c["ok"] for c in checks) if checks else None  # None: --no-check
    path = write_record(
        args.name or f"gpu_attention_{args.target}",
        {
            "device": torch.cuda.get_device_name(0),
            "driver": gpu_driver(),
            "versions": versions("apache-tvm", "torch", "inferx_edge"),
            "checks": checks,
            "checks_ok": checks_ok,
            "results": results,
        },
    )
    verdict = {None: "not run", True: "all OK", False: "FAILED"}[checks_ok]
    print(f"wrote {path}; numerics checks {verdict}")


if __name__ == "__main__":
    main()
