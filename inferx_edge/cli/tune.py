"""Tune a model's kernels with MetaSchedule for a target; records go to tuning_logs/ and build uses them."""

from __future__ import annotations

import argparse
from pathlib import Path

from inferx_edge.cli._common import add_model_arguments, quantization_options
from inferx_edge.compiler.variant import PRECISIONS
from inferx_edge.models import DEFAULT_MODEL
from inferx_edge.quantize.calibration import DEFAULT_METHOD, OBSERVERS
from inferx_edge.tune.driver import SEARCHES


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_arguments(p)
    p.add_argument("--precision", default="fp32", choices=PRECISIONS, help="precision to tune, as built (default fp32)")
    p.add_argument("--calib", type=Path, default=None, help="int8/mixed: calibration data (see build --help)")
    p.add_argument("--calib-method", default=DEFAULT_METHOD, choices=list(OBSERVERS))
    p.add_argument("--quant-plan", type=Path, default=None, help="int8/mixed: a plan written by 'quantize'")
    p.add_argument("--float-between-layers", action="store_true", help="int8/mixed: as build --float-between-layers")
    p.add_argument(
        "--trials",
        type=int,
        default=256,
        help="measured candidates the database should hold for this model (default 256); "
        "a rerun adds only what is missing",
    )
    p.add_argument("--minutes", type=float, default=None, help="stop this run after N minutes (resumable)")
    p.add_argument("--trials-per-task", type=int, default=None, help="cap per task (default: scheduler decides)")
    p.add_argument("--per-iter", type=int, default=16, help="candidates per measurement round (default 16)")
    p.add_argument("--rpc", metavar="HOST:PORT", default=None, help="TVM RPC tracker to measure on a device")
    p.add_argument("--key", default=None, help="device key registered with the tracker (with --rpc)")
    p.add_argument(
        "--config",
        type=Path,
        default=None,
        help="RPC config (target: {tracker, key}); default $INFERX_CONFIG, then ~/.config/inferx_edge/rpc.yaml",
    )
    p.add_argument("--tuning-logs", type=Path, default=None, help="database root (default: tuning_logs/)")
    p.add_argument(
        "--search",
        default="metaschedule",
        choices=SEARCHES,
        help="metaschedule: MetaSchedule's schedule space for every kernel (default); tiles (CUDA, "
        "fp16/int8/mixed): every candidate tile of build's tensor-core schedule, each kernel measured on the "
        "GPU ('int8-tiles': the same, its earlier name)",
    )
    p.add_argument(
        "--prune", action="store_true", help="after tuning keep only the best record per kernel (small, for committing)"
    )


def run(args: argparse.Namespace) -> int:
    from inferx_edge.frontend import parse_input_shapes
    from inferx_edge.records.metaschedule import prune
    from inferx_edge.targets import get_target, host_target_name
    from inferx_edge.tune import TuneOptions, tune_model
    from inferx_edge.tune.driver import print_summary
    from inferx_edge.tune.runners import RPCSettings

    spec = get_target(args.target or host_target_name())
    rpc = RPCSettings.parse(args.rpc, args.key) if args.rpc else None
    opts = TuneOptions(
        model=args.model or DEFAULT_MODEL,
        target=spec.name,
        input_shapes=parse_input_shapes(args.input_shape),
        precision=args.precision,
        trials=args.trials,
        minutes=args.minutes,
        trials_per_task=args.trials_per_task,
        per_iter=args.per_iter,
        rpc=rpc,
        config=args.config,
        root=args.tuning_logs,
        quant=quantization_options(args),
        search=args.search,
    )
    if opts.search == "tiles":
        from inferx_edge.tune.driver import tune_tiles
        from inferx_edge.tune.tiles import print_tile_summary

        print_tile_summary(tune_tiles(opts))
        return 0
    summary = tune_model(opts)
    print_summary(summary)
    if args.prune:
        before, after = prune(summary.work_dir)
        print(f"pruned {summary.work_dir}: {before} -> {after} records")
    return 0
