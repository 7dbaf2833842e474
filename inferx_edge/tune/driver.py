"""``tune``: MetaSchedule over every task of a model, resumable, with progress and a wall-clock limit.

Steps: import the model -> legalize + fuse as ``build`` does (``compiler.tuning.legalized_and_fused``)
-> extract tasks -> lock and repair the database -> subtract the trials it already holds -> tune with
the gradient task scheduler (budget goes where the FLOP-weighted expected gain is) -> summary.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import platform
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from inferx_edge.compiler.variant import PRECISIONS, QUANTIZED
from inferx_edge.errors import UsageError, check_choice
from inferx_edge.frontend import import_model
from inferx_edge.quantize.driver import QuantOptions
from inferx_edge.records import metaschedule as tdb
from inferx_edge.targets import get_target
from inferx_edge.tune.runners import RPCSettings, check_local_measurement, rpc_from_config

#: what ``tune`` searches: MetaSchedule's schedule space for every kernel, or (CUDA fp16/int8/mixed) the
#: tensor-core tiles of build's own schedule, kernel by kernel (:mod:`inferx_edge.tune.tiles`);
#: "int8-tiles" is the name releases before fp16 tiles used for "tiles"
SEARCHES = ("metaschedule", "tiles", "int8-tiles")
#: precisions whose CUDA variants have tensor-core kernels the tile search measures
TILE_PRECISIONS = ("fp16", "int8", "mixed")


@dataclass(frozen=True, kw_only=True)
class TuneOptions:
    """What to tune and how long.

    Attributes
    ----------
    model, target, input_shapes, precision : as for ``build``; the kernels tuned are the ones ``build``
        compiles for that precision (fp16 after mixed precision, int8/mixed after quantization by
        ``quant``, as ``build`` does).
    trials : total measured candidates the database should hold for this model (a resumed run only
        adds what is missing).
    minutes : wall-clock limit for this run (None: until ``trials``).
    trials_per_task : cap per task (None: the scheduler decides).
    per_iter : candidates measured per round of a task.
    rpc : measure on a remote device instead of this machine (default: the RPC config's entry for the
        target, :func:`inferx_edge.tune.runners.config_paths`).
    config : the RPC config file to read (default: ``$INFERX_CONFIG``, then ``~/.config/inferx_edge/rpc.yaml``).
    root : directory holding databases (default ``tuning_logs/``).
    search : one of :data:`SEARCHES`; with "tiles", ``trials``/``trials_per_task``/``per_iter``
        do not apply (every candidate tile of every kernel is measured once).
    """

    model: Path
    target: str
    input_shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    precision: str = "fp32"
    trials: int = 256
    minutes: float | None = None
    trials_per_task: int | None = None
    per_iter: int = 16
    rpc: RPCSettings | None = None
    root: Path | None = None
    seed: int | None = None
    quant: QuantOptions = field(default_factory=QuantOptions)
    search: str = "metaschedule"
    config: Path | None = None

    def __post_init__(self) -> None:
        check_choice("precision", self.precision, PRECISIONS)
        check_choice("search", self.search, SEARCHES)
        if self.search == "int8-tiles":
            object.__setattr__(self, "search", "tiles")
        if self.search == "tiles":
            spec = get_target(self.target)
            if not spec.is_cuda or self.precision not in TILE_PRECISIONS:
                raise UsageError(
                    f"--search tiles measures tensor-core tiles: it needs a CUDA target and --precision "
                    f"{', '.join(TILE_PRECISIONS)} (got {self.target}, {self.precision}); use --search metaschedule"
                )
        if self.trials <= 0:
            raise UsageError(f"--trials must be positive, got {self.trials}")
        if self.minutes is not None and self.minutes <= 0:
            raise UsageError(f"--minutes must be positive, got {self.minutes}")
        if self.per_iter <= 0:
            raise UsageError(f"--per-iter must be positive, got {self.per_iter}")


def precision_module(imported, spec, opts: TuneOptions, log):
    """The Relax module ``build`` compiles for ``opts.precision`` on ``spec`` (same rewrites, same
    layouts, same kernels)."""
    from inferx_edge.compiler.variant import prepare_variant, variant_layout

    quantize = None
    if opts.precision in QUANTIZED:
        from inferx_edge.quantize.driver import quantizer, resolve_plan

        plan = resolve_plan(opts.model, opts.input_shapes, imported, opts.precision, opts.quant, log=log)
        quantize = quantizer(plan, opts.precision)
    return prepare_variant(imported, variant_layout(spec, opts.precision), quantize=quantize).mod


@dataclass
class TuneSummary:
    work_dir: Path
    tasks: list[dict]
    trials_before: int
    trials_run: int
    valid_run: int
    seconds: float
    cost_model: str
    stopped_by_time: bool = False

    @property
    def valid_per_minute(self) -> float:
        return self.valid_run / (self.seconds / 60) if self.seconds > 0 else 0.0


def cost_model_name() -> str:
    """xgboost's model when installed; otherwise MetaSchedule's random model, which on small budgets
    (~64 trials per task) performs like xgb (measured) and needs no training data."""
    try:
        import xgboost  # noqa: F401
    except ImportError:
        return "random"
    return "xgb"


def _tuning_inputs(opts: TuneOptions, log):
    """What both searches start from: the target, the RPC settings (None: this machine, checked to be
    able to measure), the model's database directory, and the module ``build`` compiles, legalized and
    fused as ``build`` fuses it."""
    from inferx_edge.compiler.tuning import legalized_and_fused

    spec = get_target(opts.target)
    rpc = opts.rpc or rpc_from_config(spec.name, opts.config)
    if rpc is not None and rpc.warning():
        print(rpc.warning(), file=sys.stderr)
    if rpc is None:
        check_local_measurement(spec)
        from inferx_edge.runtime._tvm import set_default_cpu_threads

        set_default_cpu_threads()  # local candidates run with the thread count the runtime will use here
    log(f"[1/4] importing {opts.model}")
    imported = import_model(opts.model, opts.input_shapes)
    work_dir = tdb.model_database_dir(spec, imported, opts.precision, opts.root)
    prepared = precision_module(imported, spec, opts, log)
    return spec, rpc, work_dir, legalized_and_fused(prepared, spec.is_cuda, spec.sm_count)


def tune_tiles(opts: TuneOptions, log=print):
    """``tune --search tiles``: the kernels build compiles for ``opts``, their tiles measured on the
    GPU (local or ``opts.rpc``); returns a :class:`~inferx_edge.tune.tiles.TileSearchSummary`."""
    from inferx_edge.tune.tiles import search_tiles

    spec, rpc, work_dir, mod = _tuning_inputs(opts, log)
    log(f"[2/4] database {work_dir}")
    summary = search_tiles(mod, spec, work_dir, minutes=opts.minutes, rpc=rpc, log=log)
    log(f"[4/4] done in {summary.seconds:.0f} s; 'build' applies the recorded tiles")
    return summary


_MS_LOGGER = "tvm.s_tir.meta_schedule"


@contextlib.contextmanager
def own_meta_schedule_logging():
    """MetaSchedule independent of the caller's logging setup, for the duration of a run.

    MetaSchedule's ``create_loggers`` (called for every task context) builds a ``dictConfig`` that lists
    every handler already on the ``tvm.s_tir.meta_schedule`` logger by name: a handler without a name
    (``addHandler(logging.StreamHandler())`` by an application or a test harness) crashes it with
    ``'NoneType' object has no attribute 'format'``, and one named outside its config with "Unable to
    add handler". Those handlers are set aside while tuning and put back after, with the logger's level;
    MetaSchedule's own console output stays at warnings (its default is DEBUG)."""
    logger = logging.getLogger(_MS_LOGGER)
    foreign = [h for h in logger.handlers if not (h.get_name() or "").startswith(_MS_LOGGER)]
    level = logger.level
    for h in foreign:
        logger.removeHandler(h)
    logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        for h in foreign:
            logger.addHandler(h)
        logger.setLevel(level)


def tune_model(opts: TuneOptions, log=print) -> TuneSummary:
    with own_meta_schedule_logging():
        return _tune_model(opts, log)


def _tune_model(opts: TuneOptions, log) -> TuneSummary:
    from tvm.s_tir import meta_schedule as ms

    from inferx_edge.compiler.compile import resolve_tvm_target
    from inferx_edge.compiler.tensor_intrinsics import import_tensor_intrinsics
    from inferx_edge.tune.builder import PersistentBuilder
    from inferx_edge.tune.progress import Progress, TimeLimitReached
    from inferx_edge.tune.scheduler import CommittingScheduler

    spec, rpc, work_dir, mod = _tuning_inputs(opts, log)
    import_tensor_intrinsics()
    target = resolve_tvm_target(spec)
    extracted = tunable_tasks(mod, target)
    log(f"[2/4] {len(extracted)} tasks; database {work_dir}")

    with tdb.locked(work_dir):
        tdb.repair(work_dir)
        index = _workload_index(work_dir)
        stats = tdb.trials_per_workload(work_dir)
        before = {t.task_name: stats.get(index.get(_shash(t), -1), {"trials": 0})["trials"] for t in extracted}
        have = max(sum(before.values()), tdb.trials_done(work_dir))
        remaining = opts.trials - have
        if remaining <= 0:
            log(f"[3/4] database already holds {have} trials for this model (budget {opts.trials}): nothing to tune")
            return _summary(work_dir, extracted, index, have, 0, 0, 0.0, "-", False)
        tdb.unpack(work_dir)  # MetaSchedule appends to the plain file
        database = ms.database.JSONDatabase(work_dir=str(work_dir))
        cost = cost_model_name()
        log(
            f"[3/4] tuning: {remaining} new trials (database has {have}), {opts.per_iter} per round, "
            f"cost model '{cost}', {'rpc ' + rpc.host + ':' + str(rpc.port) + '/' + rpc.key if rpc else 'local runner'}"
            + (f", limit {opts.minutes:g} min" if opts.minutes else "")
        )
        contexts, weights = ms.relax_integration.extracted_tasks_to_tune_contexts(
            extracted, work_dir=str(work_dir), seed=opts.seed
        )
        if rpc:
            runner = ms.runner.RPCRunner(
                rpc_config=ms.runner.RPCConfig(
                    tracker_host=rpc.host, tracker_port=rpc.port, tracker_key=rpc.key, session_timeout_sec=120
                ),
                evaluator_config=ms.runner.EvaluatorConfig(number=3, repeat=1, min_repeat_ms=40),
            )
        else:
            runner = ms.runner.LocalRunner(
                evaluator_config=ms.runner.EvaluatorConfig(number=3, repeat=1, min_repeat_ms=40)
            )
        cross = spec.cross_compiler if platform.machine() != spec.host_arch else None
        builder = PersistentBuilder(cross_compiler=cross)
        progress = Progress([t.task_name for t in extracted], before, remaining, opts.minutes)
        callbacks = ms.measure_callback.MeasureCallback.create("default") + [progress.callback()]
        t0 = time.time()
        try:
            ms.tune.tune_tasks(
                tasks=contexts,
                task_weights=weights,
                work_dir=str(work_dir),
                max_trials_global=remaining,
                max_trials_per_task=opts.trials_per_task,
                num_trials_per_iter=opts.per_iter,
                builder=builder,
                runner=runner,
                database=database,
                cost_model=cost,
                measure_callbacks=callbacks,
                task_scheduler=CommittingScheduler(prior=_prior_best(extracted, index, stats)),
            )
        except (TimeLimitReached, RuntimeError):  # TVM's FFI hands the callback's exception back as RuntimeError
            if not progress.stopped_by_time:
                raise
            # the measured batches are in the database; the summary says the run was cut short
        except KeyboardInterrupt:
            progress.close()  # end the bar before the message
            log("interrupted: every finished trial is in the database; run the same command to continue")
            raise
        finally:
            builder.shutdown()
            progress.close()
            tdb.note_trials(work_dir, have + progress.trials)
        seconds = time.time() - t0
        return _summary(
            work_dir,
            extracted,
            _workload_index(work_dir),
            have,
            progress.trials,
            progress.valid,
            seconds,
            cost,
            progress.stopped_by_time,
        )


def tunable_tasks(mod, target) -> list:
    """MetaSchedule's tasks of ``mod``, less hand-scheduled kernels (``tirx.is_scheduled``: the fused
    attention kernel, already bound to threads with its own tensor-core calls; nothing to search)."""
    from tvm.s_tir import meta_schedule as ms

    from inferx_edge.compiler.prim_funcs import is_scheduled

    return [t for t in ms.relax_integration.extract_tasks(mod, target) if not is_scheduled(t.mod["main"])]


def _prior_best(extracted, index: dict[str, int], stats: dict) -> dict[int, float]:
    """Task index -> the best latency (s) the database already holds for it (valid records only)."""
    out = {}
    for i, t in enumerate(extracted):
        s = stats.get(index.get(_shash(t), -1))
        if s and s["valid"] and not math.isinf(s["best_s"]):
            out[i] = s["best_s"]
    return out


def _task_flops(task) -> float:
    try:
        from tvm.s_tir.analysis import estimate_tir_flops

        return float(estimate_tir_flops(task.dispatched[0]))
    except Exception:  # noqa: BLE001 - an estimate only: a kernel it cannot analyse counts 0
        return 0.0


def _shash(task) -> str:
    """The key MetaSchedule's JSON database files a task's workload under (its structural hash)."""
    import tvm_ffi

    return str(tvm_ffi.structural_hash(task.dispatched[0]))


def _workload_index(work_dir: Path) -> dict[str, int]:
    out = {}
    for i, line in enumerate(tdb.workload_bytes(work_dir).splitlines()):
        try:
            out.setdefault(json.loads(line)[0], i)
        except (ValueError, IndexError):
            continue
    return out


def _summary(work_dir, extracted, index, before, run, valid, seconds, cost, by_time) -> TuneSummary:
    stats = tdb.trials_per_workload(work_dir)
    tasks = []
    for t in extracted:
        s = stats.get(index.get(_shash(t), -1), {"trials": 0, "valid": 0, "best_s": math.inf})
        tasks.append(
            {
                "task": t.task_name,
                "weight": int(t.weight),
                "trials": int(s["trials"]),
                "valid": int(s["valid"]),
                "best_us": None if math.isinf(s["best_s"]) else s["best_s"] * 1e6,
                "flops": _task_flops(t) * int(t.weight),
            }
        )
    total_flops = sum(t["flops"] for t in tasks) or 1.0
    total_us = sum((t["best_us"] or 0.0) * t["weight"] for t in tasks) or 1.0
    for t in tasks:
        t["flop_share"] = t["flops"] / total_flops
        t["time_share"] = (t["best_us"] or 0.0) * t["weight"] / total_us if t["best_us"] is not None else None
    return TuneSummary(work_dir, tasks, before, run, valid, seconds, cost, by_time)


def print_summary(summary: TuneSummary, out=sys.stdout) -> None:
    """The kernels of the model, largest share of the work first: calls per inference, share of the
    FLOPs, trials, best measured time and its share of the tuned time."""
    head = f"{'kernel':40s} {'calls':>5s} {'FLOPs':>6s} {'trials':>6s} {'valid':>6s} {'best':>11s} {'time':>6s}"
    print(head, file=out)
    est, untuned = 0.0, []
    for t in sorted(summary.tasks, key=lambda t: -t.get("flop_share", 0.0)):
        best = f"{t['best_us']:.1f} us" if t["best_us"] is not None else "untuned"
        share = f"{t['time_share'] * 100:.0f} %" if t.get("time_share") is not None else "-"
        est += (t["best_us"] or 0.0) * t["weight"]
        if t["best_us"] is None:
            untuned.append(t["task"])
        print(
            f"{t['task'][:40]:40s} {t['weight']:5d} {t.get('flop_share', 0.0) * 100:5.0f}% {t['trials']:6d} "
            f"{t['valid']:6d} {best:>11s} {share:>6s}",
            file=out,
        )
    print(
        f"tuned kernels: {est / 1e3:.3f} ms per inference"
        + (f"; {len(untuned)} kernel(s) without a valid record keep default schedules" if untuned else ""),
        file=out,
    )
    if summary.trials_run:
        print(
            f"this run: {summary.trials_run} trials ({summary.valid_run} valid) in {summary.seconds:.0f} s = "
            f"{summary.valid_per_minute:.1f} valid trials/min; cost model {summary.cost_model}"
            + ("; stopped at the time limit" if summary.stopped_by_time else ""),
            file=out,
        )
    print(f"database: {summary.work_dir}", file=out)
