"""Compile a model ahead of time into a versioned, checksummed artifact for one target."""

from __future__ import annotations

import argparse
from pathlib import Path

from inferx_edge.cli._common import (
    add_model_arguments,
    add_quantization_arguments,
    quantization_options,
)
from inferx_edge.compiler.cuda import CUDA_CODE_FORMATS
from inferx_edge.compiler.variant import PRECISIONS
from inferx_edge.models import DEFAULT_MODEL
from inferx_edge.tune.driver import SEARCHES


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_arguments(p)
    p.add_argument(
        "--output", "-o", type=Path, default=None, help="artifact file to write (default: build/<model>-<target>.ixa)"
    )
    p.add_argument(
        "--precision",
        default=None,
        help=f"numeric precision, one of {', '.join(PRECISIONS)}: int8 is calibrated, mixed is int8 with fp32 "
        "layers where an accuracy budget needs them; a comma list builds one variant per precision (default: "
        "fp32). LLM checkpoints (.gguf, Hugging Face directories): q4, q4_1 (Q4_1 GGUFs without loss), int8, fp16, fp32 (default: q4)",
    )
    p.add_argument(
        "--max-perplexity-increase",
        type=float,
        default=None,
        metavar="PCT",
        help="LLMs, q4/q4_1: keep the most sensitive layers in int8 until perplexity on --calib TEXT is within "
        "PCT per cent of fp32 (per-layer sensitivity table in the manifest)",
    )
    p.add_argument(
        "--context-length",
        type=int,
        default=None,
        help="LLMs: the longest prompt + output a sequence may reach (default: the checkpoint's, at most 4096)",
    )
    p.add_argument(
        "--batch-sizes",
        default=None,
        metavar="B1,B2,...",
        help="build one variant per batch size (the model's batch dimension must be dynamic)",
    )
    add_quantization_arguments(p)
    p.add_argument(
        "--force",
        action="store_true",
        help="replace an existing artifact of another build at --output (default: keep it as NAME.N.ixa)",
    )
    p.add_argument(
        "--sign",
        type=Path,
        default=None,
        metavar="KEY",
        help="sign the artifact with this Ed25519 private key (see keygen)",
    )
    p.add_argument("--no-tuning", action="store_true", help="ignore tuning databases: default schedules only")
    p.add_argument(
        "--tune-minutes",
        type=float,
        default=None,
        metavar="N",
        help="tune on this machine for N minutes first (shared by the variants; resumable), then build with it",
    )
    p.add_argument(
        "--tune-search",
        choices=SEARCHES,
        default=None,
        help="what --tune-minutes searches (see tune --search); default: tiles for CUDA fp16/int8/mixed "
        "variants, metaschedule otherwise",
    )
    p.add_argument("--tuning-logs", type=Path, default=None, help="database root (default: tuning_logs/)")
    p.add_argument(
        "--cuda-code",
        choices=CUDA_CODE_FORMATS,
        default="cubin",
        help="CUDA targets: cubin for the exact GPU (default) or PTX the driver JIT-compiles",
    )
    p.add_argument(
        "--jobs",
        type=int,
        default=None,
        metavar="N",
        help="compile N variants at once, one process each (default: one per two physical cores and per 3 GiB "
        "of available memory, at most one per variant; 1: one after the other in this process)",
    )
    p.add_argument(
        "--no-cuda-graph",
        action="store_true",
        help="CUDA targets: launch every kernel from the VM instead of replaying CUDA graphs of the static "
        "parts of the model (captured on the first run)",
    )


def _batch_sizes(value: str | None) -> tuple[int, ...]:
    from inferx_edge.errors import UsageError

    if not value:
        return ()
    try:
        return tuple(int(b) for b in value.split(","))
    except ValueError:
        raise UsageError(f"--batch-sizes must be a comma list of integers, got '{value}'") from None


def _run_llm(args: argparse.Namespace, spec) -> int:
    from inferx_edge.errors import UsageError
    from inferx_edge.llm.build import LLMBuildOptions, build_llm_artifact

    if args.batch_sizes or args.input_shape or args.tune_minutes:
        raise UsageError("--batch-sizes, --input-shape and --tune-minutes apply to CNN models, not LLMs")
    precisions = tuple(args.precision.split(",")) if args.precision else ("q4",)
    output = args.output or Path("build") / f"{args.model.stem}-{spec.name}-{'+'.join(precisions)}.ixa"
    opts = LLMBuildOptions(
        model=args.model, target=spec.name, output=output, precisions=precisions, cuda_code=args.cuda_code,
        sign_key=args.sign, context_length=args.context_length, calib_text=args.calib,
        max_ppl_increase=args.max_perplexity_increase, force=args.force,
    )  # fmt: skip
    manifest = build_llm_artifact(opts)
    print(
        f"wrote {output} ({output.stat().st_size / 2**20:.1f} MiB; target {spec.name}; variants "
        f"{', '.join(v.name for v in manifest.variants)}"
        + (f"; signed with {args.sign}" if args.sign else "; unsigned")
        + ")"
    )
    return 0


def run(args: argparse.Namespace) -> int:
    from inferx_edge.build import BuildOptions, build_artifact, default_output
    from inferx_edge.frontend import parse_input_shapes
    from inferx_edge.llm import is_llm_checkpoint
    from inferx_edge.targets import get_target, host_target_name

    model = args.model or DEFAULT_MODEL
    spec = get_target(args.target or host_target_name())
    if is_llm_checkpoint(model):
        return _run_llm(args, spec)
    precisions = tuple((args.precision or "fp32").split(","))
    batch_sizes = _batch_sizes(args.batch_sizes)
    output = args.output or default_output(model, spec.name, precisions, batch_sizes)
    opts = BuildOptions(
        model=model,
        target=spec.name,
        output=output,
        input_shapes=parse_input_shapes(args.input_shape),
        precisions=precisions,
        batch_sizes=batch_sizes,
        cuda_code=args.cuda_code,
        cuda_graph=not args.no_cuda_graph,
        tuning=not args.no_tuning,
        quant=quantization_options(args),
        tuning_root=args.tuning_logs,
        sign_key=args.sign,
        force=args.force,
        tune_minutes=args.tune_minutes,
        tune_search=args.tune_search,
        jobs=args.jobs,
    )
    manifest = build_artifact(opts)
    size = output.stat().st_size
    print(
        f"wrote {output} ({size / 1024:.0f} KiB; target {spec.name}; variants "
        f"{', '.join(v.name for v in manifest.variants)}"
        + (f"; signed with {args.sign}" if args.sign else "; unsigned")
        + ")"
    )
    return 0
