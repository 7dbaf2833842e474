"""INT8 accuracy of the zoo's real-weight models on real data that exists offline: ImageNet classifiers
on natural photographs (scikit-image's sample images, scikit-learn's and matplotlib's), MiniLM on the
licence texts Debian ships. No labelled ImageNet exists here, so classifiers report INT8-vs-FP32 top-1
agreement and top-5 containment; the encoder reports embedding cosine similarity.

Calibration and evaluation use disjoint photographs (each augmented by crops and flips).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

_MEAN, _STD = np.array([0.485, 0.456, 0.406]), np.array([0.229, 0.224, 0.225])


def _photos() -> list[np.ndarray]:
    """Every colour photograph available offline, as HxWx3 uint8 (sorted by source for stable splits)."""
    from PIL import Image

    paths: list[Path] = []
    try:
        import skimage.data

        root = Path(skimage.data.__file__).parent
        paths += sorted(p for p in root.iterdir() if p.suffix in (".png", ".jpg"))
    except ImportError:
        pass
    try:
        import sklearn.datasets

        paths += sorted((Path(sklearn.datasets.__file__).parent / "images").glob("*.jpg"))
    except ImportError:
        pass
    try:
        import matplotlib

        paths += sorted(Path(matplotlib.get_data_path(), "sample_data").glob("*.jpg"))
    except ImportError:
        pass
    out = []
    for p in paths:
        try:
            img = np.asarray(Image.open(p).convert("RGB"))
        except Exception:  # noqa: BLE001 - not an image PIL reads: skip it
            continue
        src = np.asarray(Image.open(p))
        if src.ndim == 3 and min(img.shape[:2]) >= 128:  # colour photographs only
            out.append(img)
    if len(out) < 8:
        raise RuntimeError("too few sample photographs: pip install scikit-image scikit-learn")
    return out


def _views(img: np.ndarray, size: int) -> list[np.ndarray]:
    """Centre crop plus four corner crops at 87.5 % of the short side, each also flipped; resized to size."""
    from PIL import Image

    h, w = img.shape[:2]
    s = int(min(h, w) * 0.875)
    corners = [((h - s) // 2, (w - s) // 2), (0, 0), (0, w - s), (h - s, 0), (h - s, w - s)]
    out = []
    for y, x in corners:
        crop = Image.fromarray(img[y : y + s, x : x + s]).resize((size, size), Image.BILINEAR)
        a = np.asarray(crop, np.float32)
        out += [a, a[:, ::-1]]
    return out


def _normalise(spec, views: list[np.ndarray]) -> np.ndarray:
    x = np.stack(views)
    if spec.name == "efficientnet_lite0":
        x = (x - 127.0) / 128.0
    else:
        x = (x / 255.0 - _MEAN) / _STD
    return np.ascontiguousarray(x.transpose(0, 3, 1, 2), np.float32)


def images(spec, split: str) -> np.ndarray:
    """Model-ready images: ``calib`` from the first 4 photographs (40 views), ``eval`` from the rest."""
    photos = _photos()
    chosen = photos[:4] if split == "calib" else photos[4:]
    return _normalise(spec, [v for p in chosen for v in _views(p, spec.image)])


#: what each real-weight model is compared in: (precision, calibration method, budget in points or None
#: for the default, the kind of model the row is for or None for all); ``mixed`` measures its budget as
#: top-1 agreement for classifiers and as embedding cosine for the encoder (``--accuracy-metric auto``).
#: The encoder's goal (mean cosine >= 0.99) is a 1-point budget; on the 43 budget samples of a
#: classifier one changed prediction is 2.3 points, so the default 0.5 allows none and 2.5 allows one.
QUANTIZED = (
    ("int8", "entropy", None, None),
    ("int8", "mse", None, None),
    ("mixed", "mse", None, None),
    ("mixed", "mse", 1.0, "text"),
    ("mixed", "mse", 2.5, "image"),
)


def eval_samples(m, d: Path) -> list[dict]:
    """The evaluation inputs of real-weight model ``m`` (exported in ``d``), one batch-1 dict each: the
    texts after the 16 calibration ones, or the evaluation photographs' views."""
    if m.is_text:
        data = dict(np.load(d / "text.npz"))
        return [{k: v[i : i + 1] for k, v in data.items()} for i in range(16, len(data["input_ids"]))]
    return [{"image": x[None]} for x in images(m, "eval")]


def run(models, dirs, built, target: str, save, sink: list | None = None) -> list[dict]:
    """Build fp32 and the :data:`QUANTIZED` variants (batch 1) of each real-weight model for ``target``
    and compare them with fp32 on real data (``mixed``: the budget is measured on every third
    evaluation sample, the default 0.5-point budget: top-1 agreement for classifiers, 100 x the mean
    embedding cosine for text encoders, i.e. >= 0.995)."""
    from benchmarks.zoo import build_job
    from inferx_edge.runtime import Engine

    results = sink if sink is not None else []
    for m in models:
        if not m.real_weights:
            continue
        d = dirs[m.name]
        work = d.parent / "_accuracy"
        exported = json.loads((d / "export.json").read_text()) if (d / "export.json").exists() else {}
        if not exported.get("real_weights"):
            results.append(
                {"model": m.name, "error": "exported with seeded random weights (its weights package was not "
                 "installed where benchmarks.zoo_export ran): accuracy not measured"}
            )  # fmt: skip
            print(f"{m.name}: {results[-1]['error']}", flush=True)
            continue
        samples = eval_samples(m, d)
        work.mkdir(parents=True, exist_ok=True)
        np.savez(work / f"{m.name}_budget.npz", **{k: np.concatenate([s[k] for s in samples[::3]]) for k in samples[0]})
        ref = None
        for precision, method, points, kind in (("fp32", "", None, None),) + QUANTIZED:
            if kind is not None and kind != ("text" if m.is_text else "image"):
                continue
            budget = work / f"{m.name}_budget.npz" if precision == "mixed" else None
            tag = f"-{method}" + (f"-{points:g}pt" if points is not None else "")
            info = build_job(
                m.name, str(d), target, precision, (1,), str(work), method or "entropy", budget, tag, max_drop=points
            )
            if "error" in info:
                results.append(
                    {"model": m.name, "precision": precision, "calib_method": method, "budget_points": points,
                     "error": info["error"]}
                )  # fmt: skip
                continue
            with Engine(Path(info["artifact"]), trust=False) as eng:
                eng.select(f"{precision}-b1")
                name = eng.variant.outputs[0].name
                out = np.concatenate([eng.run(s)[name] for s in samples]).astype(np.float64)
            if ref is None:
                ref = out
                continue
            row = {"model": m.name, "precision": precision, "calib_method": method, "samples": len(samples)}
            if precision == "mixed":
                row["budget_points"] = 0.5 if points is None else points
            row["int8_mac_share"] = info.get("int8_mac_share")
            row |= _compare(m, ref, out)
            results.append(row)
            print(row, flush=True)
            save()
    return results


def _compare(m, f: np.ndarray, q: np.ndarray) -> dict:
    row = {"rel_error_vs_fp32": round(float(np.linalg.norm(q - f) / np.linalg.norm(f)), 5)}
    if m.is_text:
        cos = np.sum(f * q, 1) / (np.linalg.norm(f, axis=1) * np.linalg.norm(q, axis=1))
        return row | {"cosine_mean": round(float(cos.mean()), 5), "cosine_min": round(float(cos.min()), 5)}
    top5 = [f.argmax(1)[i] in np.argsort(-q[i])[:5] for i in range(len(f))]
    return row | {
        "top1_agreement": round(float(np.mean(f.argmax(1) == q.argmax(1))), 4),
        "fp32_top1_in_top5": round(float(np.mean(top5)), 4),
    }
