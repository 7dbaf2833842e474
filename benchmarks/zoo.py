"""The model zoo, out of the box (no tuning database for any of its models): every network built by
inferx_edge and timed against its peers in one process, one run, same inputs.

    # GPU host: inferx int8/fp16 vs torch.compile (inductor, CUDA graphs) fp16, NVML energy
    python -m benchmarks.zoo --target h200 --out DIR [--models a,b] [--batches 1,64] [--jobs 12]
    # CPU host: inferx fp32 untuned vs onnxruntime fp32; int8 accuracy of the real-weight models
    python -m benchmarks.zoo --target x86-cpu --out DIR [--accuracy]
    # cross targets, structural: every precision builds (compile time, device code, fallbacks)
    python -m benchmarks.zoo --target jetson-orin --build-only --precisions fp32,fp16,int8

Models come from ``--zoo-dir`` (``benchmarks/zoo_export.py`` writes it) or are exported on the spot
into it where torch + torchvision import. Builds run ``--jobs`` at a time in worker processes (each builds one
model x precision with every batch), timing runs afterwards one system at a time in this process.
Writes ``<name>.json`` (the record, rewritten after every row, so a cut run keeps what it measured) and
``<name>.md`` (model x system x batch: img/s, p50, mJ/img, error) under ``benchmarks/results/`` and DIR.
"""

from __future__ import annotations

import argparse
import json
import time
import traceback
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

import numpy as np

from benchmarks import zoo_accuracy
from benchmarks._record import versions, write_record
from benchmarks.zoo_models import ZOO, select, spec_of

GPU_SYSTEMS = ("inferx-int8", "inferx-fp16", "torch-compile", "torch-eager")
CPU_SYSTEMS = ("inferx-fp32", "onnxruntime")


def rel_error(got, ref) -> float:
    got = np.asarray(got, np.float64).reshape(np.shape(ref))
    return float(np.linalg.norm(got - ref) / max(np.linalg.norm(ref), 1e-30))


def model_dir(name: str, zoo_dir: Path, out: Path) -> Path:
    """The exported model: from the zoo cache, else exported now (needs torchvision) into the cache, so
    that later runs and tools (``kernel_profile.py``) find it, or into ``out`` where the cache cannot be
    written. The export goes to a temporary folder renamed into place once complete: an interrupted
    export leaves no half-written model for the next run to take."""
    import os
    import shutil

    d = zoo_dir / name
    if (d / "model.onnx").exists():
        return d
    from benchmarks.zoo_export import export_one

    try:
        zoo_dir.mkdir(parents=True, exist_ok=True)
        partial = zoo_dir / f".{name}.partial-{os.getpid()}"
        partial.mkdir()
    except OSError:
        d = out / "models" / name
        export_one(spec_of(name), d, batch=2)
        return d
    try:
        export_one(spec_of(name), partial, batch=2)
        if d.exists():  # an empty or half-written folder from before this rule
            shutil.rmtree(d)
        partial.rename(d)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return d


def calibration(name: str, d: Path, batches: int = 16) -> Path:
    """Calibration data: real images / real text for real-weight models, seeded samples otherwise."""
    spec = spec_of(name)
    path = d / "calib.npz"
    if spec.real_weights and spec.is_text and (d / "text.npz").exists():
        data = dict(np.load(d / "text.npz"))
        data = {k: v[:batches] for k, v in data.items()}
    else:
        data = spec.example(batches, seed=1)
        if spec.real_weights and not spec.is_text:
            try:
                data = {"image": zoo_accuracy.images(spec, "calib")}
            except (ImportError, RuntimeError):  # no sample photographs on this host: seeded samples
                pass
    np.savez(path, **data)
    return path


def _worker_init(threads: int) -> None:
    import os

    os.environ["TVM_NUM_THREADS"] = str(threads)  # calibration runs on the host: no oversubscription


def build_job(
    name: str,
    d: str,
    target: str,
    precision: str,
    batches: tuple[int, ...],
    out: str,
    calib_method: str = "entropy",
    eval_data: Path | None = None,
    tag: str = "",
    tune_tiles_min: float | None = None,
    max_drop: float | None = None,
) -> dict:
    """One artifact (model x precision, every batch), in a worker process. With ``tune_tiles_min`` (CUDA,
    fp16/int8) the tensor-core tile search runs first for that long (split over the batches) into a
    database under ``out`` that the build then applies. ``max_drop``: the accuracy budget in points (mixed
    default 0.5)."""
    from inferx_edge.build import BuildOptions, build_artifact
    from inferx_edge.quantize.driver import QuantOptions
    from inferx_edge.tune.driver import TILE_PRECISIONS

    spec, d, out = spec_of(name), Path(d), Path(out)
    art = out / "artifacts" / f"{name}-{target}-{precision}{tag}.ixa"
    art.parent.mkdir(parents=True, exist_ok=True)
    quant = (
        QuantOptions(
            calib=calibration(name, d), calib_method=calib_method, eval_data=eval_data, max_accuracy_drop=max_drop
        )
        if precision in ("int8", "mixed")
        else QuantOptions()
    )
    lines: list[str] = []
    tuned = tune_tiles_min is not None and precision in TILE_PRECISIONS
    tuning_root = out / "tuning_logs"
    t0 = time.time()
    tune_s = None
    try:
        if tuned:
            tune_tiles(d / "model.onnx", spec, target, precision, batches, tune_tiles_min, tuning_root, quant, lines)
            tune_s = round(time.time() - t0, 1)
            t0 = time.time()
        manifest = build_artifact(
            BuildOptions(
                model=d / "model.onnx",
                target=target,
                output=art,
                input_shapes=spec.input_shapes(batches[0]),
                batch_sizes=batches,
                precisions=(precision,),
                tuning=tuned,
                tuning_root=tuning_root if tuned else None,
                force=True,
                quant=quant,
                jobs=1,  # --jobs builds share the host already: their variants compile one after the other
            ),
            log=lines.append,
        )
    except Exception as exc:  # the record says which model/precision failed and why
        return {"model": name, "precision": precision, "error": f"{type(exc).__name__}: {exc}"[:1500]}
    v = manifest.variants[0]
    info = {
        "model": name,
        "precision": precision,
        "artifact": str(art),
        "batches": list(batches),
        "build_s": round(time.time() - t0, 1),
        "compile_s": manifest.build.get("compile_s"),
        **({"tune_tiles_s": tune_s, "tuning": [x.extra.get("tuning") for x in manifest.variants]} if tuned else {}),
        "schedule_fallbacks": sorted(
            {f["kernel"] for x in manifest.variants for f in x.extra.get("schedule_fallbacks", [])}
        ),
        "attention": sorted({x.extra.get("attention", "matmul") for x in manifest.variants}),
        "device_code": {
            k: manifest.target.get(k) for k in ("cuda_code", "cuda_code_arch", "cuda_toolkit") if k in manifest.target
        },
    }
    if "quantization" in v.extra:
        info["int8_mac_share"] = v.extra["quantization"]["int8_mac_share"]
        info["calib_method"] = calib_method
    return info


def tune_tiles(model, spec, target, precision, batches, minutes, root, quant, lines) -> None:
    """``tune --search tiles`` for every batch of the artifact, ``minutes`` in all, each in a fresh
    process (the search measures on the GPU: a CUDA context does not survive this worker's fork)."""
    import subprocess
    import sys

    for b in batches:
        cmd = [sys.executable, "-m", "inferx_edge", "tune", "--model", str(model), "--target", target,
               "--precision", precision, "--search", "tiles", "--minutes", f"{minutes / len(batches):g}",
               "--tuning-logs", str(root)]  # fmt: skip
        for k, dims in spec.input_shapes(b).items():
            cmd += ["--input-shape", f"{k}:{'x'.join(map(str, dims))}"]
        if quant.calib is not None:
            cmd += ["--calib", str(quant.calib), "--calib-method", quant.calib_method]
        done = subprocess.run(cmd, capture_output=True, text=True)
        lines.extend((done.stdout + done.stderr).splitlines()[-40:])
        if done.returncode != 0:
            raise RuntimeError(f"tune --search tiles (batch {b}) exited {done.returncode}: {done.stderr[-800:]}")


def torch_system(system: str, name: str, x: dict, ref_dtype: str = "float16"):
    import torch

    spec = spec_of(name)
    net = spec.make().cuda()
    args = [torch.from_numpy(v).cuda() for v in x.values()]
    if not spec.is_text:
        net = net.half().to(memory_format=torch.channels_last)
        args = [a.half().contiguous(memory_format=torch.channels_last) for a in args]
    else:
        net = net.half()
    if system == "torch-compile":
        net = torch.compile(net, mode="reduce-overhead")
    with torch.inference_mode():
        for _ in range(3):
            out = net(*args)
        torch.cuda.synchronize()
        out = net(*args)
        outs = [o.float().cpu().numpy() for o in (out if isinstance(out, (tuple, list)) else [out])]

    def call():
        with torch.inference_mode():
            net(*args)

    from benchmarks.gpu_vision import Timed

    return Timed(call, torch.cuda.synchronize), outs


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("/tmp/zoo"))
    ap.add_argument("--target", default="h200")
    ap.add_argument(
        "--models",
        default=None,
        help=f"comma list (default: the whole zoo): {', '.join(ZOO)}; 'extra': architectures outside it",
    )
    ap.add_argument("--batches", default=None, help="default 1,64 on GPUs, 1 on CPUs")
    ap.add_argument("--systems", default=None)
    ap.add_argument("--precisions", default="fp32,fp16,int8", help="for --build-only")
    ap.add_argument("--build-only", action="store_true", help="structural: build, record, time nothing")
    ap.add_argument("--accuracy", action="store_true", help="int8 vs fp32 on real data for real-weight models")
    ap.add_argument("--zoo-dir", type=Path, default=Path.home() / ".cache/inferx_edge/zoo")
    ap.add_argument("--jobs", type=int, default=2, help="builds at a time (worker processes)")
    ap.add_argument("--worker-threads", type=int, default=2, help="TVM CPU threads per build worker")
    ap.add_argument("--window", type=float, default=2.0)
    ap.add_argument(
        "--rounds", type=int, default=1,
        help="timing windows per system, the systems interleaved; rows report the median, the table the "
        "spread of the per-round ratios",
    )  # fmt: skip
    ap.add_argument("--name", default=None)
    ap.add_argument(
        "--tune-tiles", type=float, default=None, metavar="MINUTES",
        help="CUDA fp16/int8: run the tile search this long per model (split over batches) before building",
    )  # fmt: skip
    args = ap.parse_args(argv)
    if args.rounds < 1 or args.window <= 0:
        ap.error(f"--rounds must be >= 1 and --window > 0 (got {args.rounds}, {args.window})")
    from inferx_edge.targets import get_target

    spec = get_target(args.target)
    gpu = spec.is_cuda and not args.build_only
    systems = (args.systems or ",".join(GPU_SYSTEMS if gpu else CPU_SYSTEMS)).split(",")
    batches = tuple(int(b) for b in (args.batches or ("1,64" if gpu else "1")).split(","))
    models = select(args.models)
    args.out.mkdir(parents=True, exist_ok=True)
    name = args.name or f"zoo_{args.target}{'_build' if args.build_only else ''}"
    record: dict = {
        "target": args.target,
        "build_only": args.build_only,
        "batches": list(batches),
        "systems": systems,
        "window_s": args.window,
        "rounds": args.rounds,
        "tune_tiles_min": args.tune_tiles,
        "models": {m.name: {"kind": m.kind, "real_weights": m.real_weights, "note": m.note} for m in models},
        "builds": [],
        "results": [],
        "accuracy": [],
    }

    def save():
        rec = write_record(name, record | {"versions": versions("apache-tvm", "torch", "onnxruntime", "inferx_edge")})
        (args.out / rec.name).write_text(rec.read_text())
        md = markdown(record)
        rec.with_suffix(".md").write_text(md)
        (args.out / f"{name}.md").write_text(md)

    dirs = {}
    for m in list(models):  # a model that cannot be exported here is recorded, the others still run
        try:
            dirs[m.name] = model_dir(m.name, args.zoo_dir, args.out)
        except Exception as exc:
            error = f"export failed: {type(exc).__name__}: {exc}"[:600]
            record["builds"].append({"model": m.name, "precision": "-", "error": error})
            print(f"{m.name}: export failed, skipped ({type(exc).__name__}: {exc})", flush=True)
            models.remove(m)
    if args.build_only:
        precisions = args.precisions.split(",")
    else:
        precisions = [s.split("-")[1] for s in systems if s.startswith("inferx-")]
    jobs = [(m.name, p) for m in models for p in precisions]
    if spec.is_cuda:  # once here, inherited by the forked build workers
        from inferx_edge.compiler.tensor_intrinsics import import_tensor_intrinsics

        import_tensor_intrinsics()
    print(f"building {len(jobs)} artifacts for {args.target}, {args.jobs} at a time", flush=True)
    built: dict[tuple[str, str], dict] = {}
    pool = ProcessPoolExecutor(args.jobs, initializer=_worker_init, initargs=(args.worker_threads,))
    futs = {
        pool.submit(
            build_job, n, str(dirs[n]), args.target, p, batches, str(args.out), tune_tiles_min=args.tune_tiles
        ): (n, p)
        for n, p in jobs
    }
    # the workers are forked by now (before CUDA is initialised here): compile the peers while they build
    peers = prepare_peers(models, systems, batches) if gpu else {}
    for f in as_completed(futs):
        info = f.result()
        built[futs[f]] = info
        record["builds"].append(info)
        print(json.dumps(info)[:600], flush=True)
        save()
    pool.shutdown()
    if args.accuracy:
        zoo_accuracy.run(models, dirs, built, args.target, save=save, sink=record["accuracy"])
    if not args.build_only:
        measure(record, models, dirs, built, systems, batches, gpu, args.window, save, peers, args.rounds)
    save()
    print(f"wrote {name}.json / {name}.md", flush=True)


def prepare_peers(models, systems, batches) -> dict:
    """Per (model, batch): the seeded input, the torch fp32 reference and every torch system compiled
    and warmed up (``(runner, outputs)`` or the error text), so timing later runs on a quiet host."""
    import torch

    peers: dict = {}
    for m in models:
        for batch in batches:
            x = m.example(batch, seed=3)
            try:
                entry = {"x": x, "ref": reference(m, None, x, True)}
            except Exception as exc:  # the model's rows record it; other models still run
                peers[(m.name, batch)] = {"x": x, "error": f"reference failed: {type(exc).__name__}: {exc}"[:600]}
                traceback.print_exc()
                continue
            for system in (s for s in systems if s.startswith("torch")):
                t0 = time.time()
                try:
                    entry[system] = torch_system(system, m.name, x) + (round(time.time() - t0, 1),)
                except Exception as exc:  # recorded in the row
                    entry[system] = f"{type(exc).__name__}: {exc}"[:600]
                    traceback.print_exc()
                print(f"{m.name} b{batch} {system}: ready in {time.time() - t0:.0f} s", flush=True)
            peers[(m.name, batch)] = entry
            torch.cuda.empty_cache()
    return peers


def measure(record, models, dirs, built, systems, batches, gpu, window, save, peers, rounds: int = 1) -> None:
    """Per (model, batch): every system's output error, then ``rounds`` rounds of one ``window`` per
    system, the systems interleaved (order reversed every other round, so a drift in clock or
    temperature over the run falls on both sides). A row reports the median window; with several
    rounds its ``rounds`` list keeps every window, so the ratio's spread within one run is on record."""
    from inferx_edge.report.profile import measure_window
    from inferx_edge.runtime import Engine

    backend = None
    if gpu:
        import torch

        from inferx_edge.runtime.telemetry import probe

        backend = probe("nvml")
        record |= {
            "device": torch.cuda.get_device_name(0),
            "driver": getattr(backend, "driver", None),
            "power_limit_w": getattr(backend, "power_limit_w", None),
            "max_sm_mhz": getattr(backend, "max_sm_mhz", None),
        }
    for m in models:
        d = dirs[m.name]
        for batch in batches:
            peer = peers.get((m.name, batch), {})
            x = peer.get("x") or m.example(batch, seed=3)
            if "error" in peer:
                for system in systems:
                    record["results"].append(
                        {"model": m.name, "system": system, "batch": batch, "error": peer["error"]}
                    )
                continue
            ref = peer["ref"] if "ref" in peer else reference(m, d, x, gpu)
            rows, runners = {}, {}
            for system in systems:
                row = rows[system] = {"model": m.name, "system": system, "batch": batch}
                try:
                    runner, outs = _runner(system, m, d, x, batch, built, peer, row, Engine)
                    row["rel_error_vs_fp32"] = rel_error(outs[0], ref)
                    runner.benchmark(x, warmup=5, repeat=5, min_seconds=0.5)
                    runners[system] = runner
                except Exception as exc:  # recorded; the next system still runs
                    row["error"] = f"{type(exc).__name__}: {exc}"[:600]
                    traceback.print_exc()
            windows: dict[str, list] = {s: [] for s in runners}
            for r in range(rounds):
                for system in list(runners) if r % 2 == 0 else list(runners)[::-1]:
                    try:
                        # a short warm-up right before each window: the other systems ran in between
                        runners[system].benchmark(x, warmup=3, repeat=1, min_seconds=0.1)
                        windows[system].append(measure_window(runners[system], x, batch, backend, window))
                    except Exception as exc:  # recorded; the other systems still run
                        rows[system]["error"] = f"{type(exc).__name__}: {exc}"[:600]
                        traceback.print_exc()
                        del runners[system]
            for system, row in rows.items():
                if "error" not in row and windows.get(system):
                    row |= summarise_windows(windows[system], keep=rounds > 1)
                closer = getattr(runners.get(system), "close", None)
                if closer:
                    closer()
                record["results"].append(row)
                print(json.dumps({k: v for k, v in row.items() if k != "rounds"}), flush=True)
            save()
            if gpu:
                import torch

                torch.cuda.empty_cache()
    if backend is not None:
        backend.close()


def _runner(system, m, d, x, batch, built, peer, row, engine_cls):
    """``(runner, outputs)`` for one system: the built artifact's variant, onnxruntime, or a torch peer
    compiled before the timing started."""
    if system.startswith("inferx-"):
        precision = system.split("-")[1]
        info = built.get((m.name, precision), {})
        if "error" in info or not info:
            raise RuntimeError(info.get("error", "not built"))
        runner = engine_cls(Path(info["artifact"]), trust=False)
        runner.select(f"{precision}-b{batch}")
        res = runner.run(x)
        return runner, [res[o.name] for o in runner.variant.outputs]
    if system == "onnxruntime":
        return ort_system(d, x)
    if isinstance(peer.get(system), str):
        raise RuntimeError(peer[system])
    if system not in peer:
        raise RuntimeError(f"no runner for system {system!r}")
    runner, outs, row["setup_s"] = peer[system]
    return runner, outs


def summarise_windows(windows: list[dict], keep: bool) -> dict:
    """A row's numbers from its windows: the median of each (one window: that window), the clock and
    temperature the windows ended at, and with ``keep`` every window."""

    def med(key, scale=1.0):
        vals = [w[key] * scale for w in windows if w.get(key) is not None]
        return float(np.median(vals)) if vals else None

    out = {
        "img_s": med("fps"),
        "p50_ms": med("p50_ms"),
        "p90_ms": med("p90_ms"),
        "mJ_img": med("j_per_frame", 1e3),
        "avg_w": med("avg_w"),
    }
    mhz = [w["state"]["gpu_mhz"] for w in windows if w["state"].get("gpu_mhz") is not None]
    temp = [w["state"]["temp_c"] for w in windows if w["state"].get("temp_c") is not None]
    throttle = sorted({t for w in windows for t in w["state"].get("throttle", [])})
    if mhz:
        out["sm_mhz"] = [min(mhz), max(mhz)]
    if temp:
        out["temp_c_max"] = max(temp)
    if throttle:
        out["throttle"] = throttle
    if keep:
        out["rounds"] = [
            {
                "img_s": w["fps"],
                "p50_ms": w["p50_ms"],
                "mJ_img": w["j_per_frame"] * 1e3 if w.get("j_per_frame") is not None else None,
                **({"sm_mhz": w["state"]["gpu_mhz"]} if w["state"].get("gpu_mhz") is not None else {}),
            }
            for w in windows
        ]
    return out


def reference(m, d: Path, x: dict, gpu: bool) -> np.ndarray:
    """The fp32 reference output for ``x``: torch fp32 on the GPU, onnxruntime fp32 on a CPU host."""
    if gpu:
        import torch

        net = m.make().cuda()
        with torch.inference_mode():
            out = net(*[torch.from_numpy(v).cuda() for v in x.values()])
        out = out[0] if isinstance(out, (tuple, list)) else out
        return out.double().cpu().numpy()
    _, outs = ort_system(d, x)
    return np.asarray(outs[0], np.float64)


def ort_system(d: Path, x: dict):
    import onnxruntime as ort

    from inferx_edge.runtime._tvm import cpu_thread_budget

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = cpu_thread_budget()
    opts.inter_op_num_threads = 1
    sess = ort.InferenceSession(str(d / "model.onnx"), opts, providers=["CPUExecutionProvider"])

    class Runner:
        def benchmark(self, inputs, warmup=5, repeat=50, min_seconds=0.0):
            from inferx_edge.runtime.engine import time_calls

            return time_calls(lambda: sess.run(None, inputs), lambda: None, warmup, repeat, min_seconds)

    return Runner(), sess.run(None, x)


def markdown(record: dict) -> str:
    """model x system x batch table, ratios against the peer (torch-compile on GPUs, onnxruntime on CPUs;
    no ratio columns where neither ran)."""
    rows = [r for r in record["results"] if "error" not in r]
    peer = next((p for p in ("torch-compile", "onnxruntime") if p in record["systems"]), None)
    base = {(r["model"], r["batch"]): r for r in rows if r["system"] == peer}
    # the target the code was built for, and the GPU that ran it where that is another kind (h200 code on
    # an H100 host)
    ran_on = f" (run on {record['device']})" if record.get("device") else ""
    out = [f"# Zoo on {record['target']}{ran_on}{' (build only)' if record['build_only'] else ''}", ""]
    rounds = record.get("rounds", 1) > 1
    clocks = any("sm_mhz" in r for r in rows)  # GPU rows with NVML: the SM clock each window ended at
    if rows:
        if rounds:
            spread_note = f"; the last column is the lowest and highest per-round img/s ratio to {peer}" if peer else ""
            out += [f"Medians of {record['rounds']} interleaved windows per system{spread_note}.", ""]
        ratios = f" img/s vs {peer} | p50 vs {peer} |" if peer else ""
        spread = f" img/s vs {peer} per round |" if rounds and peer else ""
        columns = 7 + clocks + (2 if peer else 0) + bool(spread)
        out += [
            f"| model | system | batch | img/s | p50 ms | mJ/img |{' SM MHz |' if clocks else ''} rel. error vs fp32 "
            f"|{ratios}{spread}",
            "|" + "---|" * columns,
        ]
        for r in rows:
            b = base.get((r["model"], r["batch"]))
            ratio = f"{r['img_s'] / b['img_s']:.2f}x" if b else "-"
            p50 = f"{b['p50_ms'] / r['p50_ms']:.2f}x" if b else "-"
            mj = f"{r['mJ_img']:.2f}" if r.get("mJ_img") is not None else "-"
            mhz = "-" if "sm_mhz" not in r else "-".join(dict.fromkeys(f"{v:.0f}" for v in r["sm_mhz"]))
            line = (
                f"| {r['model']} | {r['system']} | {r['batch']} | {r['img_s']:.1f} | {r['p50_ms']:.3f} | {mj} | "
                + (f"{mhz} | " if clocks else "")
                + f"{r['rel_error_vs_fp32']:.2e} |"
                + (f" {ratio} | {p50} |" if peer else "")
            )
            if spread:
                pairs = [a["img_s"] / c["img_s"] for a, c in zip(r.get("rounds", []), (b or {}).get("rounds", []))]
                line += f" {min(pairs):.2f}-{max(pairs):.2f}x |" if pairs else " - |"
            out.append(line)
    failed = [r for r in record["results"] if "error" in r]
    out += [
        "",
        "## Builds",
        "",
        "| model | precision | build s | int8 MAC share | fallback kernels | error |",
        "|---|---|---|---|---|---|",
    ]
    for b in sorted(record["builds"], key=lambda b: (b["model"], b["precision"])):
        share = f"{b['int8_mac_share'] * 100:.0f} %" if "int8_mac_share" in b else "-"
        out.append(
            f"| {b['model']} | {b['precision']} | {b.get('build_s', '-')} | {share} | "
            f"{len(b.get('schedule_fallbacks', []))} | {b.get('error', '')[:200]} |"
        )
    if record.get("accuracy"):
        out += [
            "",
            "## INT8 accuracy on real data (vs the fp32 build)",
            "",
            "| model | precision | calibration | int8 MAC share | top-1 agreement | fp32 top-1 in top-5 | cosine mean / min | rel. error | samples |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for a in record["accuracy"]:
            precision = a.get("precision", "-")
            if a.get("budget_points") is not None:
                precision += f" ({a['budget_points']:g}-point budget)"
            if "error" in a:
                out.append(
                    f"| {a['model']} | {precision} | {a.get('calib_method', '-')} | failed: {a['error'][:150]} |||||| "
                )
                continue
            share = f"{a['int8_mac_share'] * 100:.0f} %" if a.get("int8_mac_share") is not None else "-"
            cos = f"{a['cosine_mean']} / {a['cosine_min']}" if "cosine_mean" in a else "-"
            out.append(
                f"| {a['model']} | {precision} | {a['calib_method']} | {share} | {a.get('top1_agreement', '-')} | "
                f"{a.get('fp32_top1_in_top5', '-')} | {cos} | {a['rel_error_vs_fp32']} | {a['samples']} |"
            )
    if failed:
        out += ["", "## Failed runs", ""] + [
            f"- {r['model']} {r['system']} b{r['batch']}: {r['error'][:300]}" for r in failed
        ]
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    main()
