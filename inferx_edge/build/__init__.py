"""The build stage: import -> quantize (int8/mixed) -> prepare and compile each variant -> package.

One variant per (precision, batch size); variants with the same weights share one weights file. The
CLI's ``build`` and ``evaluate`` call :func:`build_artifact`; so can any program. ``variants.py``
compiles the variants, one after the other or in worker processes (``BuildOptions.jobs``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from inferx_edge.compiler.variant import PRECISIONS, QUANTIZED
from inferx_edge.errors import UsageError, check_choice
from inferx_edge.package import Manifest, Variant
from inferx_edge.package.bundle import keep_other_build
from inferx_edge.package.scratch import scratch_dir
from inferx_edge.quantize.driver import QuantOptions
from inferx_edge.targets import TargetSpec, get_target


@dataclass(frozen=True, kw_only=True)
class BuildOptions:
    """What to build.

    Attributes
    ----------
    model : ONNX file or ``.pt2`` torch.export program.
    target : target name or alias (``python -m inferx_edge targets``).
    output : artifact file to write (replaced atomically).
    input_shapes : pinned input shapes, by input name.
    precisions : one variant per precision, each one of :data:`~inferx_edge.compiler.variant.PRECISIONS`.
    batch_sizes : one variant per batch size (default: the model's pinned batch).
    cuda_code : CUDA targets only: ``cubin`` (exact architecture, nothing compiled on the device) or
        ``ptx`` (the driver JIT-compiles it for its GPU, same or newer architecture).
    cuda_graph : CUDA targets only: the static parts of the model run as CUDA graphs (Relax
        ``RewriteCUDAGraph``), captured on a variant's first run and replayed after: one launch
        instead of one per kernel. Weights must stay at the addresses they had at capture (the
        runtime loads them once per variant).
    cuda_options : CUDA targets only: device compiler and source patches
        (:class:`~inferx_edge.compiler.cuda.CudaOptions`; default: from the environment).
    tuning : apply the model's tuning database for this target when one exists (kernels it does not
        cover keep default schedules: a build never fails for lack of tuning).
    tuning_root : where databases live (default ``tuning_logs/``).
    quant : calibration and accuracy budget of int8/mixed variants (:class:`~inferx_edge.quantize.driver.QuantOptions`).
    sign_key : Ed25519 private key (PEM) to sign the artifact with (:mod:`inferx_edge.package.signing`).
    force : replace an existing artifact at ``output`` that holds another build (other model, target or
        variants); without it that one is kept as ``<name>.<n>.ixa``. A rebuild of the same is replaced.
    jobs : variants compiled at once, each in its own process (None: one per two physical cores and
        per 3 GiB of available memory, at most one per variant; 1: in this process, one after the
        other). Calibration runs first, once.
    tune_minutes : tune first (on this machine), this many minutes in all, shared by the variants, then
        build with the records (a resumed database only adds to what it holds).
    tune_search : what ``tune_minutes`` searches (``tune --search``); None: the tensor-core tile search
        for CUDA fp16/int8/mixed variants (their time is in those kernels: ResNet-18 int8 on the H200
        went from 1.03x to 1.63x torch.compile after 5 minutes), MetaSchedule for the rest.
    """

    model: Path
    target: str
    output: Path
    input_shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    precisions: tuple[str, ...] = ("fp32",)
    batch_sizes: tuple[int, ...] = ()
    cuda_code: str = "cubin"
    cuda_graph: bool = True
    cuda_options: object | None = None
    tuning: bool = True
    tuning_root: Path | None = None
    quant: QuantOptions = field(default_factory=QuantOptions)
    sign_key: Path | None = None
    force: bool = False
    tune_minutes: float | None = None
    tune_search: str | None = None
    jobs: int | None = None

    def __post_init__(self) -> None:
        from inferx_edge.compiler.cuda import CUDA_CODE_FORMATS

        if not self.precisions:
            raise UsageError(f"no precision given; valid: {', '.join(PRECISIONS)}")
        for p in self.precisions:
            check_choice("precision", p, PRECISIONS)
        if self.tune_minutes is not None and not self.tune_minutes > 0:
            raise UsageError(f"--tune-minutes must be positive, got {self.tune_minutes}")
        if self.tune_minutes is not None and not self.tuning:
            raise UsageError("--tune-minutes and --no-tuning contradict each other: pick one")
        if self.tune_search is not None and self.tune_minutes is None:
            raise UsageError("--tune-search chooses what --tune-minutes searches: give --tune-minutes N too")
        if self.jobs is not None and self.jobs < 1:
            raise UsageError(f"--jobs must be at least 1, got {self.jobs}")
        if any(b <= 0 for b in self.batch_sizes):
            raise UsageError(f"batch sizes must be positive, got {list(self.batch_sizes)}")
        check_choice("CUDA code format", self.cuda_code, CUDA_CODE_FORMATS)
        if self.sign_key is not None:
            from inferx_edge.package.signing import load_private_key

            load_private_key(self.sign_key)  # a missing or wrong key fails before an hour of compiling

    def variant_grid(self, model_batch: int) -> list[tuple[str, int]]:
        """(precision, batch) of every variant: ``precisions`` x ``batch_sizes`` (default: the model's batch)."""
        return [(p, b) for p in self.precisions for b in (self.batch_sizes or (model_batch,))]


def _weights_member(files: dict, precision: str, variant: str, names: list[str], arrays: list[np.ndarray]) -> str:
    """The artifact member holding a variant's weights: an existing file with the same weights (e.g. the
    other batch sizes of a precision), else ``weights/<precision>.npz``, else ``weights/<variant>.npz``."""
    for member, (n, a) in files.items():
        if n == names and all(x.dtype == y.dtype and np.array_equal(x, y) for x, y in zip(a, arrays)):
            return member
    member = f"weights/{precision}.npz" if f"weights/{precision}.npz" not in files else f"weights/{variant}.npz"
    files[member] = (names, arrays)
    return member


def default_output(model: Path, target: str, precisions=("fp32",), batch_sizes=()) -> Path:
    """Where ``build`` and ``evaluate`` write an artifact unless told: model, target, precisions (and
    batch sizes when several), so builds of one model for different precisions do not collide."""
    name = f"{model.stem}-{target}-{'+'.join(precisions)}"
    if batch_sizes:
        name += "-b" + "+".join(str(b) for b in batch_sizes)
    return Path("build") / f"{name}.ixa"


def _model_batch(base) -> int:
    """The batch the imported model was pinned to (its first input's leading dimension)."""
    return base.inputs[0].shape[0] if base.inputs and base.inputs[0].shape else 1


def _shapes_at(opts: BuildOptions, base, batch: int) -> dict[str, tuple[int, ...]]:
    """The pinned input shapes with every input's batch dimension set to ``batch``."""
    return {**opts.input_shapes, **{t.name: (batch, *t.shape[1:]) for t in base.inputs}}


def tune_search_for(opts: BuildOptions, spec: TargetSpec, precision: str) -> str:
    """The search ``--tune-minutes`` runs for one variant: ``opts.tune_search`` when set, else tiles for
    CUDA tensor-core precisions and MetaSchedule for everything else."""
    from inferx_edge.tune.driver import TILE_PRECISIONS

    if opts.tune_search is not None:
        return opts.tune_search
    return "tiles" if spec.is_cuda and precision in TILE_PRECISIONS else "metaschedule"


def _tune_first(opts: BuildOptions, spec: TargetSpec, base, log) -> None:
    """``--tune-minutes``: a time-limited search per variant before the build (:func:`tune_search_for`)."""
    from inferx_edge.tune import TuneOptions, tune_model
    from inferx_edge.tune.driver import print_summary

    grid = opts.variant_grid(_model_batch(base))
    for precision, batch in grid:
        shapes = _shapes_at(opts, base, batch)
        search = tune_search_for(opts, spec, precision)
        log(f"[0/4] tuning {precision} batch {batch} for {opts.tune_minutes / len(grid):g} min ({search})")
        summary = tune_model(
            TuneOptions(
                model=opts.model, target=spec.name, input_shapes=shapes, precision=precision,
                trials=1_000_000, minutes=opts.tune_minutes / len(grid), root=opts.tuning_root, quant=opts.quant,
                search=search,
            ),
            log=log,
        )  # fmt: skip
        print_summary(summary)


def build_artifact(opts: BuildOptions, log=print, spec: TargetSpec | None = None) -> Manifest:
    """Run the whole build and write ``opts.output``. Returns the manifest written.

    ``spec`` overrides the registry entry named by ``opts.target`` (a derived target, e.g. a device's
    GPU code paired with another host CPU for verification).
    """
    from inferx_edge.runtime._tvm import set_default_cpu_threads

    set_default_cpu_threads()  # calibration and build-time weight transforms run on this CPU

    from inferx_edge.build.variants import VariantJob, compile_in_processes, compile_one, variant_jobs
    from inferx_edge.compiler.compile import new_manifest
    from inferx_edge.frontend import import_model
    from inferx_edge.package import write_artifact
    from inferx_edge.quantize.driver import resolve_plan

    spec = spec or get_target(opts.target)
    log(f"[1/4] importing {opts.model}")
    base = import_model(opts.model, opts.input_shapes)
    if opts.tune_minutes:
        _tune_first(opts, spec, base, log)
    for t in base.inputs:
        log(f"      input  {t.describe()}")
    for t in base.outputs:
        log(f"      output {t.describe()}")

    variants, members, infos = [], {}, []
    weight_files: dict[str, tuple[list[str], list[np.ndarray]]] = {}  # member -> (names, arrays)
    base_batch = _model_batch(base)
    grid = opts.variant_grid(base_batch)
    plans = {}
    for precision in dict.fromkeys(p for p, _ in grid if p in QUANTIZED):
        log(f"[1/4] quantizing for {precision}")
        plans[precision] = resolve_plan(opts.model, opts.input_shapes, base, precision, opts.quant, log=log)
    jobs = variant_jobs(opts, len(grid))
    with scratch_dir("build") as tmp:
        work = [VariantJob(p, b, i, len(grid), _shapes_at(opts, base, b), tmp) for i, (p, b) in enumerate(grid, 1)]
        calls = [(opts, spec, job, plans.get(job.precision)) for job in work]
        if jobs == 1:
            done = [compile_one(*call, imported=base if job.batch == base_batch else None, log=log)
                    for job, call in zip(work, calls)]  # fmt: skip
        else:
            done = compile_in_processes(calls, jobs, log)
        for job, (info, variant, names, arrays) in zip(work, done):
            weights_member = _weights_member(weight_files, job.precision, job.name, names, arrays)
            variants.append(Variant(**variant, weights=weights_member))
            members[variant["library"]] = job.path
            infos.append(info)

        log(f"[3/4] writing weights ({', '.join(weight_files)}; variants with the same weights share a file)")
        for member, (names, arrays) in weight_files.items():
            path = tmp / Path(member).name
            np.savez(path, **dict(zip(names, arrays)))
            members[member] = path

        info = infos[0]
        if info["cuda"]:
            log(f"      device code: {info['cuda']['code']} for {info['cuda']['arch']} by {info['cuda']['toolkit']}")
        manifest = new_manifest(spec, infos, base.describe(), variants)
        log(f"[4/4] packaging {opts.output}")
        if not opts.force:
            keep_other_build(Path(opts.output), manifest, log)
        return write_artifact(opts.output, manifest, members, sign_key=opts.sign_key)
