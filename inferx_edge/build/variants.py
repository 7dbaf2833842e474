"""Compiling a build's variants: each prepared and compiled into ``<out_dir>/<name>.so``, one after the
other in the build's process or several at once in spawned worker processes (``BuildOptions.jobs``)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from inferx_edge.errors import BuildError, InferxError
from inferx_edge.targets import TargetSpec

if TYPE_CHECKING:
    from inferx_edge.build import BuildOptions


def _log_tuning(log, tuning: dict | None, spec: TargetSpec) -> None:
    if tuning:
        log(
            f"      tuning database {tuning['database']}: {tuning['kernels_tuned']} of {tuning['kernels']} kernels tuned"
            + (f", {tuning['tiles']} tensor-core kernels with measured tiles" if tuning["tiles"] else "")
            + ", the rest default schedules"
        )
    else:
        log(
            f"      no tuning database for this model and target: default schedules "
            f"(python -m inferx_edge tune --target {spec.name})"
        )


@dataclass(frozen=True)
class VariantJob:
    precision: str
    batch: int
    index: int
    total: int
    shapes: dict[str, tuple[int, ...]]
    out_dir: Path

    @property
    def name(self) -> str:
        return f"{self.precision}-b{self.batch}"

    @property
    def path(self) -> Path:
        """The library this variant compiles to."""
        return self.out_dir / f"{self.name}.so"


#: memory one compile worker may need (DenseNet-121 int8 for h200 peaked at 2.4 GiB in one process)
WORKER_MEMORY = 3 * 2**30


def _available_memory() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def variant_jobs(opts: BuildOptions, variants: int) -> int:
    """How many variants compile at once: ``opts.jobs``, else one per two physical cores (a compile
    also has multi-threaded phases) and per :data:`WORKER_MEMORY` of available memory; never more
    than there are variants."""
    from inferx_edge.runtime._tvm import cpu_thread_budget

    jobs = opts.jobs
    if jobs is None:
        memory = _available_memory()
        jobs = min(cpu_thread_budget() // 2, memory // WORKER_MEMORY if memory else 1)
    return max(1, min(jobs, variants))


def compile_one(opts: BuildOptions, spec: TargetSpec, job: VariantJob, plan, *, imported=None, log=print):
    """Prepare and compile one variant into ``job.out_dir/<name>.so``: its compile record, the
    :class:`Variant` fields but its weights member, and its weight names and arrays. ``imported``: the
    model at this variant's shapes when the caller has it (else imported here, as a worker process does)."""
    from inferx_edge.compiler.compile import compile_variant, resolve_tvm_target
    from inferx_edge.compiler.variant import prepare_variant, variant_layout
    from inferx_edge.frontend import import_model
    from inferx_edge.quantize.driver import quantizer
    from inferx_edge.records import metaschedule as msdb

    imported = imported or import_model(opts.model, job.shapes)
    layout = variant_layout(spec, job.precision, opts.cuda_options)
    target = resolve_tvm_target(spec)
    t0 = time.perf_counter()
    # keyed by the source model's hash, pinned shapes and precision (quantizing keeps all three)
    tuning_dir, note = (
        msdb.locate_database(spec, imported, job.precision, opts.tuning_root) if opts.tuning else (None, None)
    )
    if note:
        log(f"      note: {note}")
    prepared = prepare_variant(
        imported, layout, quantize=quantizer(plan, job.precision) if plan else None, target=target,
        tuning_dir=tuning_dir, bake=True, log=log, sm_count=spec.sm_count,
    )  # fmt: skip
    quant_report = prepared.quantization
    if quant_report:
        n8 = sum(1 for r in quant_report["layers"] if r["precision"] == "int8")
        log(
            f"      {job.precision}: {n8} of {len(quant_report['layers'])} layers int8, "
            f"{quant_report['int8_mac_share'] * 100:.1f} % of conv/matmul MACs"
        )
    log(f"[2/4] compiling variant {job.name} ({job.index}/{job.total}) for {spec.name} ({spec.description})")
    prepare_s = time.perf_counter() - t0
    info = compile_variant(
        prepared, spec, job.path, name=imported.name, target=target,
        cuda_code=opts.cuda_code, cuda_graph=opts.cuda_graph, cuda_options=opts.cuda_options,
    )  # fmt: skip
    info["compile_s"] = round(info["compile_s"] + prepare_s, 3)
    tuned = info["tuning"] = prepared.tuning
    _log_tuning(log, tuned, spec)
    log(f"      compiled in {info['compile_s']:.1f} s, linked in {info['link_s']:.1f} s ({info['linker']})")
    for fb in info["schedule_fallbacks"]:
        log(f"      kernel {fb['kernel']}: schedule rule {fb['rule']} failed ({fb['error']}); next rule used")
    variant = dict(
        name=job.name, precision=job.precision, batch=int(job.batch), library=f"lib/{job.name}.so",
        params=tuple(prepared.weight_names), inputs=imported.inputs, outputs=imported.outputs,
        tuned=bool(tuned and (tuned["kernels_tuned"] or tuned["tiles"])),
        extra=({"tuning": tuned} if tuned else {})
        | ({"cuda_graph": True} if info["cuda_graph"] else {})
        | {"conv_layout": info["conv_layout"]}
        | ({"attention": "fused"} if info["attention"] == "fused" else {})
        | ({"schedule_fallbacks": info["schedule_fallbacks"]} if info["schedule_fallbacks"] else {})
        | ({"quantization": quant_report} if quant_report else {}),
    )  # fmt: skip
    return info, variant, list(prepared.weight_names), list(prepared.weight_arrays)


_worker_log = None


def _worker_init(queue, threads: int) -> None:
    """A compile worker: its log lines go to the parent through ``queue``; TVM gets ``threads`` threads."""
    import os
    import signal

    global _worker_log
    _worker_log = queue.put
    os.environ.setdefault("TVM_NUM_THREADS", str(threads))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole process group: the parent stops us


def _worker_compile(opts: BuildOptions, spec: TargetSpec, job: VariantJob, plan):
    def log(line: str) -> None:  # lines of several variants interleave: name each one
        _worker_log(line if line.startswith("[") else f"      [{job.name}] {line.strip()}")

    try:
        return compile_one(opts, spec, job, plan, log=log)
    except InferxError:
        raise
    except Exception as exc:  # noqa: BLE001 - a bug: the parent reports it with the variant it hit
        raise BuildError(f"compiling variant {job.name} failed: {type(exc).__name__}: {exc}") from None


def compile_in_processes(calls: list, jobs: int, log) -> list:
    """Run :func:`compile_one` for every ``(opts, spec, job, plan)`` in ``calls`` in ``jobs`` worker
    processes (spawned: the parent's TVM thread pool does not survive a fork), relaying their log
    lines; results in ``calls`` order."""
    import multiprocessing
    import threading
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    from inferx_edge.runtime._tvm import cpu_thread_budget

    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    threads = max(1, cpu_thread_budget() // jobs)
    each = f"{threads} TVM thread{'s' if threads > 1 else ''}"
    log(f"[2/4] compiling {len(calls)} variants, {jobs} at a time (one process each, {each} each)")
    relay = threading.Thread(target=lambda: [log(line) for line in iter(queue.get, None)], daemon=True)
    relay.start()
    try:
        with ProcessPoolExecutor(jobs, mp_context=ctx, initializer=_worker_init, initargs=(queue, threads)) as pool:
            futures = [pool.submit(_worker_compile, *call) for call in calls]
            try:
                return [f.result() for f in futures]
            except BaseException:  # an error, Ctrl-C or SIGTERM: stop the other variants' compiles too
                for proc in list((getattr(pool, "_processes", None) or {}).values()):  # no public API before 3.14
                    proc.terminate()
                pool.shutdown(wait=True, cancel_futures=True)
                raise
    except BrokenProcessPool as exc:
        raise BuildError(
            f"a compile worker process died ({exc}); out of memory? Build with --jobs 1 to compile one variant at a time"
        ) from None
    finally:
        queue.put(None)
        relay.join(timeout=10)
