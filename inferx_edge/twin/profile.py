"""``profile ARTIFACT --twin BOARD``: a profile (the schema ``profile`` writes) predicted on a twin board
for every variant x power mode, marked ``"predicted": true`` so ``report`` labels every title and table.

Variant latency comes from kernel profiles of the same model measured on a GPU host
(``scripts/kernel_profile.py --json``, one per variant's precision and batch): ``--kernel-profiles DIR``,
or the twin's shipped reference profiles when the artifact's model is one of them (ResNet-50 and
MobileNetV2 from torchvision's architectures). Power is the twin's module power while the variant runs
back to back (:mod:`inferx_edge.twin.power`).
"""

from __future__ import annotations

import json
from pathlib import Path

from inferx_edge.errors import UsageError
from inferx_edge.twin import calibrate, zoo
from inferx_edge.twin.boards import get_board
from inferx_edge.twin.latency import LatencyModel
from inferx_edge.twin.power import module_power
from inferx_edge.twin.simulate import JITTER, ModeTable, Variant, _cpu_util, gpu_activity

SCHEMA = "inferx_edge.profile/1"
ASSUMPTIONS = [
    "board figures from nvpmodel tables and data sheets (inferx_edge/twin/boards.py names each source)",
    "GPU/CPU power fitted to published AGX Orin rail powers under stress; voltage curves assumed linear",
    "kernel latency scaled from kernels measured on the reference GPU by SMs kept busy x clock and DRAM bandwidth",
    "mma.sync tensor-core rate per SM per clock equal on Orin (Ampere) and the H200",
    "host overhead scaled by CPU clock only",
]


def _profiles_for(model: str, kernel_profiles: Path | None) -> list[Path]:
    if kernel_profiles is not None:
        files = (
            sorted(Path(kernel_profiles).glob("*.json")) if Path(kernel_profiles).is_dir() else [Path(kernel_profiles)]
        )
        if not files:
            raise UsageError(f"--kernel-profiles {kernel_profiles}: no kernel profile JSON there")
        return files
    shipped = zoo.available()
    key = next((k for k in shipped if k.replace("_", "") in model.replace("_", "").lower()), None)
    if key is None:
        raise UsageError(
            f"no kernel profiles for model '{model}': the twin ships {', '.join(sorted(shipped))}; measure this "
            f"model's variants on a GPU host (python scripts/kernel_profile.py -m MODEL -t h200 --precision P "
            f"--input-shape NAME:Bx... --json DIR/kernel_profile_P_bB.json) and pass --kernel-profiles DIR"
        )
    return shipped[key]


def twin_profile(
    artifact: Path, output: Path, board: str, power_modes=None, kernel_profiles: Path | None = None, log=print
) -> dict:
    from inferx_edge.package.atomic import atomic_write
    from inferx_edge.package.bundle import read_manifest

    b = get_board(board)
    m = read_manifest(artifact)
    models = {}
    profile_files = _profiles_for(m.model["name"], kernel_profiles)
    for p in profile_files:
        lm = LatencyModel.from_profile(p)
        models[(lm.precision, lm.batch)] = lm
    variants, skipped = [], []
    for v in m.variants:
        lm = models.get((v.precision, v.batch))
        if lm is None:
            skipped.append(v.name)
            continue
        variants.append(Variant(v.name, v.precision, v.batch, lm))
    if not variants:
        have = ", ".join(f"{p}-b{n}" for p, n in sorted(models))
        raise UsageError(f"no kernel profile matches any variant of {artifact.name} (profiles for: {have})")
    if skipped:
        log(f"warning: no kernel profile for variant(s) {', '.join(skipped)}: left out of the prediction")
    if power_modes in (None, "all"):
        modes = list(b.modes)
    else:
        modes = [b.mode(int(x)) for x in power_modes]
    table = ModeTable(b, variants)
    rows = []
    for mode in modes:
        idle = table.idle_w(mode)
        for v in variants:
            run = table.runs[(v.name, mode.id)]
            ms = run["ms"]
            fps = v.batch / ms * 1e3
            watts = module_power(b, mode, gpu_activity(run), _cpu_util(run), run["mem_util"]).total_w
            rows.append(
                {
                    "name": f"{v.name}@{mode.name}",
                    "precision": v.precision,
                    "batch": v.batch,
                    "power_mode": mode.id,
                    "power_mode_name": mode.name,
                    "fps": fps,
                    "p50_ms": ms,
                    "p90_ms": ms * (1 + 1.28 * JITTER),
                    "p99_ms": ms * (1 + 2.33 * JITTER),
                    "avg_w": watts,
                    "j_per_frame": watts / fps,
                    "dynamic_w": watts - idle,
                    "dynamic_j_per_frame": (watts - idle) / fps,
                    "predicted": True,
                    "windows": [],
                }
            )
            log(f"{rows[-1]['name']:24s} {fps:9.1f} fps  {ms:8.3f} ms  {watts:5.1f} W  (predicted on a twin)")
    report = {
        "schema": SCHEMA,
        "artifact": str(artifact),
        "model": m.model["name"],
        "target": m.target["name"],
        "device": f"{b.description} (twin)",
        "driver": None,
        "telemetry": "twin",
        "power_limit_w": None,
        "idle_w": table.idle_w(b.mode(b.default_mode)),
        "window_s": 0,
        "repeats": 0,
        "host": None,
        "predicted": True,
        "twin": b.name,
        "assumptions": ASSUMPTIONS,
        "calibration": calibrate.report(),
        "kernel_profiles": sorted(str(p) for p in profile_files),
        "variants": rows,
    }
    with atomic_write(output, "w") as f:
        json.dump(report, f, indent=2)
    return report
