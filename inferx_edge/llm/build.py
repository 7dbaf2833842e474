"""Building an LLM artifact: checkpoint -> per-precision prefill/decode libraries + weights + tokenizer.

The artifact uses the CNN artifact format (manifest, checksums, signature, deploy, rollback) with
``model.kind == "llm"``; each variant is one precision (:data:`LLM_PRECISIONS`) holding
``batch_prefill``/``batch_decode``/``create_paged_kv_cache`` in one library. Members
beside the libraries: ``weights/<precision>.npz``, ``llm/tokenizer.json``, ``llm/config.json``.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from inferx_edge.compiler.prim_funcs import unscheduled
from inferx_edge.errors import BuildError, UsageError
from inferx_edge.llm.checkpoint import Checkpoint, load_checkpoint
from inferx_edge.llm.config import LlamaConfig
from inferx_edge.llm.cpu_attention import use_fast_decode_attention
from inferx_edge.llm.quant import effective_kind, get_scheme, quantize
from inferx_edge.package import Manifest, TensorSpec, Variant
from inferx_edge.package.bundle import keep_other_build, sha256_file, write_artifact
from inferx_edge.package.scratch import scratch_dir
from inferx_edge.targets import TargetSpec, get_target

LLM_PRECISIONS = ("q4", "q4_1", "int8", "fp16", "fp32")


def weight_layout(spec: TargetSpec) -> str:
    """GPUs reduce along contiguous memory (dlight's GEMV/matmul rules): ``nt``; CPUs vectorize across
    outputs: ``kn`` (:mod:`inferx_edge.llm.quant`)."""
    return "nt" if spec.is_cuda else "kn"


def activation_dtype(precision: str, spec: TargetSpec) -> str:
    """fp32 keeps fp32; on GPUs everything else computes in fp16. CPUs compute quantized weights in fp32
    (x86 and most Arm cores have no fast fp16 arithmetic; the weights still shrink 4-7x)."""
    if precision == "fp32":
        return "float32"
    if precision == "fp16" or spec.is_cuda:
        return "float16"
    return "float32"


@dataclasses.dataclass(frozen=True)
class LLMBuildOptions:
    model: Path
    target: str
    output: Path
    precisions: tuple[str, ...] = ("q4",)
    layer_precisions: dict[int, str] | None = None  # layer index -> precision overriding the variant's
    cuda_code: str = "cubin"
    sign_key: Path | None = None
    context_length: int | None = None  # default: the checkpoint's, capped at 4096
    calib_text: Path | None = None  # text for the per-layer sensitivity (with max_ppl_increase)
    max_ppl_increase: float | None = None  # per cent over fp32: mixed q4/int8 layers under this budget
    force: bool = False  # replace an artifact of another build at ``output`` (default: keep it as NAME.N.ixa)

    def __post_init__(self) -> None:
        for p in self.precisions:
            if p not in LLM_PRECISIONS:
                raise UsageError(f"unknown LLM precision '{p}'; choose from: {', '.join(LLM_PRECISIONS)}")
        if self.max_ppl_increase is not None:
            if self.calib_text is None:
                raise UsageError("a perplexity budget needs calibration text: --calib TEXT_FILE")
            if not set(self.precisions) <= {"q4", "q4_1"}:
                raise UsageError("a perplexity budget mixes int4 with int8 layers: use --precision q4 or q4_1")
            if self.max_ppl_increase < 0:
                raise UsageError(f"the perplexity budget must be >= 0 per cent, got {self.max_ppl_increase}")


def param_arrays(ck: Checkpoint, names: list[str], schemes: dict[str, tuple[str, str]], dtype: str) -> list[np.ndarray]:
    """The exported module's parameters, in ``names`` order, from the checkpoint's float32 weights.
    ``schemes`` maps a weight-matrix prefix (``layers.3.attn.qkv.weight``) to its (kind, layout)."""
    w = ck.weights
    cache: dict[str, dict[str, np.ndarray]] = {}

    def source(prefix: str) -> np.ndarray:
        parts = prefix.split(".")
        if parts[0] in ("embed_tokens", "lm_head"):
            return w[parts[0]]
        i = parts[1]
        if parts[2:4] == ["attn", "qkv"]:
            return np.concatenate([w[f"layers.{i}.{x}"] for x in "qkv"])
        if parts[2:4] == ["attn", "o"]:
            return w[f"layers.{i}.o"]
        if parts[2:4] == ["mlp", "gate_up"]:
            return np.concatenate([w[f"layers.{i}.gate"], w[f"layers.{i}.up"]])
        return w[f"layers.{i}.down"]

    out = []
    for name in names:
        prefix, leaf = name.rsplit(".", 1)
        if prefix in schemes:
            if prefix not in cache:
                kind, layout = schemes[prefix]
                cache[prefix] = quantize(source(prefix), kind, dtype, layout)
            out.append(cache[prefix][leaf])
        else:  # a norm weight: layers.3.input_layernorm.weight, norm.weight
            out.append(w[prefix].astype(dtype))
    return out


def _int4_activations(model) -> str:
    """``int8`` when some weight matrix of ``model`` takes the x86 integer int4 kernel, else its dtype."""
    return "int8" if any(m.integer_kernel for _, m in _weight_matrices(model)) else model.dtype


def _matrix_schemes(model) -> dict[str, tuple[str, str]]:
    """Weight-matrix prefix -> (effective kind, layout)."""
    return {prefix: (m.kind, m.layout) for prefix, m in _weight_matrices(model)}


def _weight_matrices(m, prefix: str = ""):
    """(prefix, matrix) for every :class:`~inferx_edge.llm.quant.WeightMatrix` in the module tree."""
    from tvm.relax.frontend import nn

    from inferx_edge.llm.quant import WeightMatrix

    if isinstance(m, WeightMatrix):
        yield prefix, m
        return
    items = enumerate(m) if isinstance(m, nn.ModuleList) else vars(m).items()
    for key, child in items:
        if isinstance(child, (nn.Module, nn.ModuleList)):
            yield from _weight_matrices(child, f"{prefix}.{key}" if prefix else str(key))


def _source_digest(path: Path) -> str:
    """sha256 of a checkpoint file, or of a directory's (name, sha256) list."""
    import hashlib

    if path.is_file():
        return sha256_file(path)
    h = hashlib.sha256()
    for f in sorted(p for p in path.iterdir() if p.is_file()):
        h.update(f"{f.name}:{sha256_file(f)}\n".encode())
    return h.hexdigest()


def llm_pipeline(spec: TargetSpec, target):
    """GPUs: TVM's CUDA pipeline with dlight's low-batch GEMV rule first for decode kernels (``[batch,
    1, in]``: TVM's default order gives them to the matmul rule, tiled for many rows). CPUs: TVM's CPU
    pipeline with :class:`~inferx_edge.llm.cpu_schedule.LLMMatmulCPU` for the weight-reading kernels,
    then our default CPU schedules and dlight's for the rest (attention, norms)."""
    if spec.is_cuda:
        return _gpu_pipeline(target)
    from inferx_edge.compiler.cpu import cpu_pipeline
    from inferx_edge.llm.cpu_schedule import LLMMatmulCPU

    return cpu_pipeline(target, first_rules=[LLMMatmulCPU()])


class _DecodeGEMV:
    """dlight's ``LowBatchGEMV`` for kernels whose output is ``[batch, 1, n]`` (one token per sequence),
    nothing for the rest (prefill goes on to the matmul rule)."""

    def __init__(self):
        from tvm.s_tir import dlight

        self.rule = dlight.gpu.LowBatchGEMV()

    def apply(self, func, target, tunable):
        from tvm import tirx

        if not unscheduled(func):
            return None
        from tvm import s_tir
        from tvm.s_tir.dlight.analysis import get_root_block

        try:
            sch = s_tir.Schedule(func)
            blocks = sch.get_child_blocks(get_root_block(sch))
            region = sch.get(blocks[-1]).writes[0] if blocks else None
            shape = list((getattr(region, "buffer", None) or region.source).shape) if region is not None else []
        except Exception:  # noqa: BLE001 - a function this rule cannot read: the next rule
            return None
        if len(shape) != 3 or not isinstance(shape[1], tirx.IntImm) or int(shape[1]) != 1:
            return None
        try:
            return self.rule.apply(func, target, tunable)
        except Exception:  # noqa: BLE001 - a shape dlight's rule cannot take: the matmul rule next
            return None


def _gpu_pipeline(target):
    import tvm
    from tvm.relax.backend.cuda import pipeline as cuda
    from tvm.s_tir import dlight

    from inferx_edge.compiler.cpu.default_schedule import _as_dlight_rule
    from inferx_edge.compiler.op_patterns import after_op_patterns

    schedule = dlight.ApplyDefaultSchedule(
        _as_dlight_rule(_DecodeGEMV()),
        dlight.gpu.Matmul(),
        dlight.gpu.GEMV(),
        dlight.gpu.Reduction(),
        dlight.gpu.GeneralReduction(),
        dlight.gpu.Fallback(),
    )
    # TVM's legalization list ends with its own dlight schedule: ours replaces it
    legalize = after_op_patterns(
        [p for p in cuda.legalize_passes(target) if type(p).__name__ != "ApplyDefaultSchedule"]
    )

    @tvm.transform.module_pass(opt_level=0, name="InferxLLMGPUPipeline")
    def pipeline(mod, _ctx):
        with target:
            passes = cuda.library_dispatch_passes(target) + legalize + [schedule]
            passes += cuda.dataflow_lower_passes(target) + cuda.finalize_passes(target)
            return tvm.transform.Sequential(passes)(mod)

    return pipeline


def _compile(mod, spec: TargetSpec, target, out: Path, cuda_code: str) -> dict[str, Any]:
    from tvm import relax

    from inferx_edge.compiler.compile import cpu_features, export_library, pass_config, plain
    from inferx_edge.compiler.cuda import device_compiler

    t0 = time.perf_counter()
    ctx = device_compiler(spec, cuda_code, None) if spec.is_cuda else contextlib.nullcontext(None)
    try:
        with ctx as cuda_record, target, pass_config(False, async_copy=False):
            ex = relax.build(mod, target, relax_pipeline=llm_pipeline(spec, target), exec_mode="compiled")
    except Exception as exc:
        raise BuildError(f"compiling the LLM for {spec.name} failed: {type(exc).__name__}: {exc}") from exc
    t1 = time.perf_counter()
    export_library(ex, spec, out)
    return {
        "tvm_target": plain(target.export()),
        "cpu_features": cpu_features(target),
        "compile_s": round(t1 - t0, 3),
        "link_s": round(time.perf_counter() - t1, 3),
        "cuda": dict(cuda_record) if cuda_record else None,
    }


def _mixed(ck: Checkpoint, precision: str, opts: LLMBuildOptions, log) -> tuple[dict[int, str], dict]:
    """Per-layer sensitivity on the calibration text and the int8 layers the budget needs."""
    from inferx_edge.llm.sensitivity import choose_layer_precisions, layer_sensitivity

    if not ck.tokenizer_json:
        raise UsageError("a perplexity budget needs the checkpoint's tokenizer (to read --calib text)")
    from tokenizers import Tokenizer

    try:
        text = Path(opts.calib_text).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read calibration text {opts.calib_text}: {exc}") from exc
    ids = Tokenizer.from_str(ck.tokenizer_json).encode(text).ids[:256]
    log(f"      sensitivity of each layer in {precision} on {len(ids)} tokens of {opts.calib_text}")
    table = layer_sensitivity(ck, precision, ids, progress=log)
    chosen, search = choose_layer_precisions(ck, table, ids, opts.max_ppl_increase, progress=log)
    log(f"      budget +{opts.max_ppl_increase} % met with {len(chosen)} layers in int8: {sorted(chosen)}")
    table.pop("_quantized")
    return chosen, table | {"search": search}


def export_model(cfg: LlamaConfig, precision: str, spec: TargetSpec, target, layer_precisions=None):
    """The Relax module, its parameter names, each weight matrix's effective kind, the activation dtype
    and the dtype int4 matrices see their activations in (``int8`` where the x86 integer kernel runs)."""
    from inferx_edge.llm.model import LlamaForCausalLM

    layer_schemes = [get_scheme((layer_precisions or {}).get(i, precision)) for i in range(cfg.num_hidden_layers)]
    model = LlamaForCausalLM(
        cfg, get_scheme(precision), activation_dtype(precision, spec), target, layer_schemes, layout=weight_layout(spec)
    )
    mod, params = model.export_tvm(spec=model.get_default_spec())
    return mod, [n for n, _ in params], _matrix_schemes(model), model.dtype, _int4_activations(model)


def build_llm_artifact(opts: LLMBuildOptions, log=print, checkpoint: Checkpoint | None = None) -> Manifest:
    """Build ``opts.model`` for ``opts.target``: one variant per precision, packaged at ``opts.output``."""
    from inferx_edge.compiler.compile import new_manifest, resolve_tvm_target

    spec = get_target(opts.target)
    log(f"[1/4] reading {opts.model}")
    t0 = time.perf_counter()
    ck = checkpoint or load_checkpoint(opts.model)
    cfg = ck.config
    if opts.context_length:
        cfg = dataclasses.replace(cfg, context_length=int(opts.context_length))
    elif cfg.context_length > 4096:
        cfg = dataclasses.replace(cfg, context_length=4096)
    n_params = sum(int(a.size) for a in ck.weights.values())
    log(
        f"      {cfg.architecture}: {cfg.num_hidden_layers} layers, hidden {cfg.hidden_size}, "
        f"{cfg.num_attention_heads}/{cfg.num_key_value_heads} heads, vocab {cfg.vocab_size}, "
        f"{n_params / 1e6:.1f} M parameters ({time.perf_counter() - t0:.1f} s)"
    )
    target = resolve_tvm_target(spec)
    variants, members, infos = [], {}, []
    with scratch_dir("inferx-llm-") as tmp:
        for i, precision in enumerate(opts.precisions, 1):
            layer_precisions, sensitivity = opts.layer_precisions, None
            if opts.max_ppl_increase is not None:
                layer_precisions, sensitivity = _mixed(ck, precision, opts, log)
            log(f"[2/4] compiling {precision} ({i}/{len(opts.precisions)}) for {spec.name}")
            mod, names, schemes, dtype, int4_activations = export_model(cfg, precision, spec, target, layer_precisions)
            if not spec.is_cuda:
                mod = use_fast_decode_attention(
                    mod, cfg.num_key_value_heads, cfg.num_attention_heads, cfg.head_dim, dtype
                )
            lib = tmp / f"{precision}.so"
            info = _compile(mod, spec, target, lib, opts.cuda_code)
            log(f"      compiled in {info['compile_s']:.1f} s, linked in {info['link_s']:.1f} s")
            arrays = param_arrays(ck, names, schemes, dtype)
            weights = tmp / f"{precision}.npz"
            np.savez(weights, **dict(zip(names, arrays)))
            kinds = dict(collections.Counter(kind for kind, _layout in schemes.values()))
            weight_bytes = int(sum(a.nbytes for a in arrays))
            log(
                f"      weights {weight_bytes / 2**20:.1f} MiB ({', '.join(f'{n} {k}' for k, n in kinds.items())} matrices)"
            )
            members[f"lib/{precision}.so"] = lib
            members[f"weights/{precision}.npz"] = weights
            variants.append(
                Variant(
                    name=precision,
                    precision=precision,
                    batch=1,
                    library=f"lib/{precision}.so",
                    weights=f"weights/{precision}.npz",
                    params=tuple(names),
                    inputs=(TensorSpec("input_ids", (None,), "int32"),),
                    outputs=(TensorSpec("logits", (None, cfg.vocab_size), "float32"),),
                    extra={
                        "llm": {
                            "dtype": dtype,
                            "weight_kinds": kinds,
                            "weight_layout": weight_layout(spec),
                            # int4 matrices on x86: activations rounded to int8 per group of 32 (cpu_int_matmul)
                            "int4_activations": int4_activations,
                            "weight_bytes": weight_bytes,
                            "layer_precisions": {str(k): v for k, v in (layer_precisions or {}).items()},
                        }
                        | ({"sensitivity": sensitivity} if sensitivity else {})
                    },
                )
            )
            infos.append(info)
        log("[3/4] writing tokenizer and generation config")
        (tmp / "config.json").write_text(
            json.dumps({"config": cfg.to_json(), "chat_template": ck.chat_template}, indent=1)
        )
        members["llm/config.json"] = tmp / "config.json"
        if ck.tokenizer_json:
            (tmp / "tokenizer.json").write_text(ck.tokenizer_json)
            members["llm/tokenizer.json"] = tmp / "tokenizer.json"
        else:
            log("      note: the checkpoint carries no tokenizer; the artifact takes token ids only")
        source = Path(opts.model)
        model = {
            "name": source.stem if source.is_file() else source.name,
            "kind": "llm",
            "source": source.name,
            "sha256": _source_digest(source),
            "format": ck.source["format"],
            "checkpoint": ck.source,
            "parameters": n_params,
            "config": cfg.to_json(),
        }
        manifest = new_manifest(spec, infos, model, variants)
        log(f"[4/4] packaging {opts.output}")
        Path(opts.output).parent.mkdir(parents=True, exist_ok=True)
        if not opts.force:
            keep_other_build(Path(opts.output), manifest, log)
        return write_artifact(opts.output, manifest, members, sign_key=opts.sign_key)


__all__ = ["LLM_PRECISIONS", "LLMBuildOptions", "build_llm_artifact", "effective_kind"]
