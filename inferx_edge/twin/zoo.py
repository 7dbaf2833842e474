"""The reference variants the twin ships: kernel profiles measured on the H200 (``data/``, written by
``python -m benchmarks.twin_kernel_profiles``) of torchvision's ResNet-50 and MobileNetV2 (seeded random
weights; speed does not depend on the values), int8 and fp16 at batch 1, 8 and 64."""

from __future__ import annotations

from pathlib import Path

from inferx_edge.errors import check_choice
from inferx_edge.twin.latency import LatencyModel
from inferx_edge.twin.simulate import Variant

DATA = Path(__file__).resolve().parent / "data"


def available() -> dict[str, list[Path]]:
    """Profiles by model name."""
    out: dict[str, list[Path]] = {}
    for p in sorted(DATA.glob("kernel_profile_*_*_b*.json")):
        _, _, _ref, rest = p.stem.split("_", 3)
        model = rest.rsplit("_", 2)[0]
        out.setdefault(model, []).append(p)
    return out


def reference_variants(model: str) -> list[Variant]:
    profiles = available()
    check_choice("twin reference model", model, sorted(profiles))
    variants = []
    for p in profiles[model]:
        lm = LatencyModel.from_profile(p)
        variants.append(Variant(f"{lm.precision}-b{lm.batch}", lm.precision, lm.batch, lm))
    return sorted(variants, key=lambda v: (v.precision, v.batch))
